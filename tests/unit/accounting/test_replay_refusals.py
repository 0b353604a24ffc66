"""`gpuwm replay` refuses numbers that are not numbers and fields it does not know: exit 2, line and field named,
nothing on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwm.cli import main

POD: dict[str, Any] = {
    "t": 0, "event": "pod", "namespace": "ml", "name": "train-0", "uid": "p1", "phase": "Running", "node": "n1",
    "labels": {}, "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "w1"},
    "devices": [{"uuid": "GPU-a", "units": 1}],
}


def _sample(t: float) -> str:
    return json.dumps({"t": t, "event": "sample", "node": "n1", "uuid": "GPU-a", "sm_percent": 50,
                       "energy_joules": 10.0 * t})


def _trace(tmp_path: Path, third_line: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join([json.dumps(POD), _sample(0), third_line, _sample(2)]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("third_line", "field"),
    [
        ('{"t": 1, "event": "sample", "node": "n1", "uuid": "GPU-a", "sm_percent": NaN}', "sm_percent"),
        ('{"t": 1, "event": "sample", "node": "n1", "uuid": "GPU-a", "energy_joules": Infinity}', "energy_joules"),
        ('{"t": 1e999, "event": "sample", "node": "n1", "uuid": "GPU-a"}', "t"),
        ('{"t": 1, "event": "sample", "node": "n1", "uuid": "GPU-a", "processes": [{"pid": 4, "sm_percent": -Infinity}]}',
         "processes.0.sm_percent"),
        ('{"t": 1, "event": "sample", "node": "n1", "uuid": "GPU-a", "smpercent": 80}', "smpercent"),
        (json.dumps({**POD, "t": 1, "devices": [{"uuid": "GPU-a", "units": 1, "contianer": "main"}]}),
         "devices.0.contianer"),
        (json.dumps({"t": 1, "event": "namespace", "name": "ml", "annotations": {"gpuwm.io/gpu-quota": "NaN"}}),
         "annotations.gpuwm.io/gpu-quota"),
        (json.dumps({"t": 1, "event": "namespace", "name": "ml", "annotations": {"gpuwm.io/gpu-quota": "1e999"}}),
         "annotations.gpuwm.io/gpu-quota"),
    ],
)
def test_refused_line_exits_2_naming_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    third_line: str, field: str) -> None:
    code = main(["replay", str(_trace(tmp_path, third_line))])
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    assert "line 3" in captured.err and f"field '{field}'" in captured.err, captured.err


def test_the_same_trace_without_the_bad_line_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the refusals above are about the third line alone: with a good one the trace replays
    code = main(["replay", str(_trace(tmp_path, json.dumps({"t": 1, "event": "namespace", "name": "ml",
                                                                 "annotations": {"gpuwm.io/gpu-quota": "2"}})))])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["workloads"][0]["allocatedGpuSeconds"] == 2
    assert report["projects"][0]["quota"] == 2


@pytest.mark.parametrize("option", ["--at", "--idle-threshold-percent", "--idle-threshold"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_options_that_are_not_finite_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str,
                                            value: str) -> None:
    code = main(["replay", str(_trace(tmp_path, _sample(1))), f"{option}={value}"])
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    assert option.removesuffix("-percent") in captured.err  # the old spelling is an alias of the shared one


def test_console_script_refuses_nan_with_exit_2(tmp_path: Path) -> None:
    trace = _trace(tmp_path, '{"t": 1, "event": "sample", "node": "n1", "uuid": "GPU-a", "power_watts": NaN}')
    result = subprocess.run([sys.executable, "-m", "gpuwm.cli", "replay", str(trace)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "line 3" in result.stderr and "field 'power_watts'" in result.stderr
    assert "finite" in result.stderr
