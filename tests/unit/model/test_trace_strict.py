"""Trace lines are read strictly: NaN/±Infinity in any number and fields the format does not know are refused.

The accepting side is tested too: every key the README's "Replay traces" section, the models,
the shared example and the simulator's `--write-trace` output use still passes.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuwm.model.sample import GpuSample, ProcessSample
from gpuwm.model.trace import PodEvent, SampleEvent, TraceLineError, gpu_quota, parse_trace_line
from gpuwm.sim.simulator import SimConfig, Simulator
from gpuwm.sim.trace import write_trace

ROOT = Path(__file__).resolve().parents[3]

SAMPLE: dict[str, Any] = {"t": 1, "event": "sample", "node": "n1", "uuid": "GPU-a", "sm_percent": 40}
POD: dict[str, Any] = {
    "t": 0, "event": "pod", "namespace": "ml", "name": "train-0", "uid": "p1", "phase": "Running", "node": "n1",
    "labels": {}, "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "w1", "created": -5},
    "devices": [{"uuid": "GPU-a", "units": 1, "container": "main"}],
}
NAMESPACE: dict[str, Any] = {"t": 0, "event": "namespace", "name": "ml", "labels": {}, "annotations": {}}
#: JSON spellings of numbers that are not: Python's reader takes the tokens, and 1e999 overflows to inf
NOT_FINITE = ("NaN", "Infinity", "-Infinity", "1e999", "-1e999")
_MARK = "__number__"


def _line(event: dict[str, Any], token: str) -> str:
    """`event` as JSON with `_MARK` replaced by `token` written as a bare JSON token."""
    return json.dumps(event).replace(f'"{_MARK}"', token)


def _numbers(model: type[Any]) -> list[str]:
    """The model's fields that hold numbers (int or float, optional or not)."""
    return [name for name, info in model.model_fields.items()
            if re.search(r"\b(int|float)\b", str(info.annotation)) and name != "healthy"]


def test_every_number_of_the_models_is_tried() -> None:
    # the lists below come from the models: a number field added later is covered without editing this file
    assert {"t", "seq", "index", "device_units", "sm_percent", "energy_joules", "temperature_celsius",
            "merged_seconds", "pcie_tx_bytes_per_second"} <= set(_numbers(GpuSample))
    assert set(_numbers(ProcessSample)) == {"pid", "sm_percent", "memory_used_bytes"}


@pytest.mark.parametrize("token", NOT_FINITE)
@pytest.mark.parametrize("name", _numbers(GpuSample))
def test_a_sample_number_that_is_not_finite_is_refused_naming_the_field(name: str, token: str) -> None:
    with pytest.raises(TraceLineError) as caught:
        parse_trace_line(_line({**SAMPLE, name: _MARK}, token), 12)
    assert (caught.value.line_number, caught.value.field) == (12, name)
    assert "finite" in str(caught.value)


@pytest.mark.parametrize("token", NOT_FINITE)
@pytest.mark.parametrize("name", _numbers(ProcessSample))
def test_a_process_number_that_is_not_finite_is_refused(name: str, token: str) -> None:
    process = {"pid": 7, "pod_uid": "p1", "sm_percent": 10, "memory_used_bytes": 1e9, name: _MARK}
    with pytest.raises(TraceLineError) as caught:
        parse_trace_line(_line({**SAMPLE, "processes": [{"pid": 6}, process]}, token), 3)
    assert caught.value.field == f"processes.1.{name}"


@pytest.mark.parametrize("token", NOT_FINITE)
@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({**POD, "t": _MARK}, "t"),
        ({**POD, "workload": {**POD["workload"], "created": _MARK}}, "workload.created"),
        ({**POD, "devices": [{"uuid": "GPU-a", "units": _MARK}]}, "devices.0.units"),
        ({**NAMESPACE, "t": _MARK}, "t"),
    ],
)
def test_pod_and_namespace_numbers_that_are_not_finite_are_refused(event: dict[str, Any], field: str,
                                                                     token: str) -> None:
    with pytest.raises(TraceLineError) as caught:
        parse_trace_line(_line(event, token), 1)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("event", "field", "hint"),
    [
        ({**SAMPLE, "smpercent": 80}, "smpercent", "sm_percent"),
        ({**SAMPLE, "processes": [{"pid": 1, "pod_uid": "p1", "smpercent": 80}]}, "processes.0.smpercent",
         "sm_percent"),
        ({**POD, "devices": [{"uuid": "GPU-a", "units": 1}, {"uuid": "GPU-b", "unit": 1}]}, "devices.1.unit",
         "units"),
        ({**POD, "workload": {**POD["workload"], "kinds": "Job"}}, "workload.kinds", "kind"),
        ({**POD, "nodeName": "n1"}, "nodeName", "node"),
        ({**NAMESPACE, "annotation": {}}, "annotation", "annotations"),
    ],
)
def test_a_field_the_format_does_not_know_is_refused_naming_it(event: dict[str, Any], field: str,
                                                                 hint: str) -> None:
    with pytest.raises(TraceLineError) as caught:
        parse_trace_line(json.dumps(event), 4)
    assert caught.value.field == field
    assert f"did you mean '{hint}'" in str(caught.value)


def test_every_field_of_the_models_is_accepted_under_its_name() -> None:
    full = {
        **SAMPLE, "seq": 3, "index": 0, "model": "H100", "parent_uuid": "GPU-p", "mig_profile": "1g.10gb",
        "device_units": 1 / 7, "healthy": True, "error": None, "memory_used_bytes": 1e9, "memory_total_bytes": 8e10,
        "memory_activity_percent": 5, "power_watts": 200, "power_limit_watts": 700, "energy_joules": 1.5,
        "temperature_celsius": -3, "sm_clock_mhz": 1980, "memory_clock_mhz": 2619, "pcie_rx_bytes_per_second": 1,
        "pcie_tx_bytes_per_second": 2, "merged_seconds": 14,
        "processes": [{"pid": 1, "pod_uid": "p1", "container": "main", "sm_percent": 30, "memory_used_bytes": 1}],
    }
    assert set(full) == set(SampleEvent.model_fields)  # the line above names every field
    assert isinstance(parse_trace_line(json.dumps(full), 1), SampleEvent)
    # the workload's apiVersion may also be written by its field name (the model takes both)
    event = parse_trace_line(json.dumps({**POD, "workload": {**POD["workload"], "api_version": "v1"}}), 1)
    assert isinstance(event, PodEvent)
    parse_trace_line(json.dumps(NAMESPACE), 1)


def _readme_trace_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Replay traces", 1)[1].split("\n## ", 1)[0]
    block = section.split("```json", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_example_and_shipped_examples_pass() -> None:
    lines = _readme_trace_lines()
    assert len(lines) == 3
    examples = sorted((ROOT / "examples").glob("*.jsonl"))
    assert examples, "examples/*.jsonl"
    for path in examples:
        lines += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for number, line in enumerate(lines, start=1):
        parse_trace_line(line, number)


def test_the_simulators_write_trace_output_passes() -> None:
    # MIG, time-sliced and whole GPUs, namespaces with a quota, merged-free samples with processes
    simulator = Simulator(SimConfig.model_validate({"seed": 12, "nodes": 4, "gpus_per_node": 2,
                                                    "interval_seconds": 2.0}))
    out = io.StringIO()
    assert write_trace(simulator, 600.0, out) > 100
    kinds = set()
    for number, line in enumerate(out.getvalue().splitlines(), start=1):
        kinds.add(parse_trace_line(line, number).event)
    assert {"namespace", "pod", "sample"} <= kinds


@pytest.mark.parametrize("text", ["NaN", "nan", "inf", "-Infinity", "1e999", "four", ""])
def test_gpu_quota_refuses_what_is_not_a_finite_number(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        gpu_quota(text)


def test_gpu_quota_reads_numbers() -> None:
    assert (gpu_quota("4"), gpu_quota(" 2.5 "), gpu_quota("0")) == (4.0, 2.5, 0.0)
