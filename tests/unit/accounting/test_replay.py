"""`gpuwm replay`: the shared worked example, output shape, and malformed input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuwm.cli import main

EXAMPLES = Path(__file__).resolve().parents[3].parent / "shared" / "examples"


def _assert_matches(actual: Any, expected: Any, path: str = "") -> None:
    """Every expected key and value is in the output (numbers compared as numbers)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), path
        for key, value in expected.items():
            assert key in actual, f"{path}.{key} missing"
            _assert_matches(actual[key], value, f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), path
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _assert_matches(a, e, f"{path}[{index}]")
    elif isinstance(expected, int | float) and not isinstance(expected, bool):
        assert isinstance(actual, int | float) and math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9), (
            f"{path}: {actual} != {expected}"
        )
    else:
        assert actual == expected, path


def _replay(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    code = main(["replay", *arguments])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.skipif(not (EXAMPLES / "basic.jsonl").exists(), reason="../shared/examples is not beside the checkout")
def test_shared_basic_example_matches_expected(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _replay(capsys, str(EXAMPLES / "basic.jsonl"), "--at", "120")
    assert code == 0, err
    expected = json.loads((EXAMPLES / "basic.expected.json").read_text())
    _assert_matches(json.loads(out), expected)


def _write(tmp_path: Path, lines: Sequence[Mapping[str, Any] | str]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


POD = {
    "t": 0,
    "event": "pod",
    "namespace": "ml",
    "name": "train-0",
    "uid": "p1",
    "phase": "Running",
    "node": "n1",
    "labels": {},
    "workload": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": "w1", "created": -5},
    "devices": [{"uuid": "GPU-a", "units": 1}],
}


def _sample(t: float, sm: float) -> dict[str, Any]:
    return {
        "t": t,
        "event": "sample",
        "node": "n1",
        "uuid": "GPU-a",
        "sm_percent": sm,
        "memory_used_bytes": 1.0e9,
        "memory_total_bytes": 8.0e10,
        "power_watts": 250,
        "energy_joules": 100.0 * t,
    }


def test_output_shape_and_default_at_is_the_last_event(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path, [{"t": 0, "event": "namespace", "name": "ml", "labels": {"gpuwm.io/project": "vision"}}, POD]
                   + [_sample(t, 37.5) for t in range(0, 11)])
    code, out, _ = _replay(capsys, str(trace))
    assert code == 0
    report = json.loads(out)
    assert report["at"] == 10
    (workload,) = report["workloads"]
    assert {k: workload[k] for k in ("namespace", "name", "kind", "apiVersion", "project")} == {
        "namespace": "ml",
        "name": "train",
        "kind": "PyTorchJob",
        "apiVersion": "kubeflow.org/v1",
        "project": "vision",
    }
    assert workload["waitSeconds"] == 5  # created -5, running at 0
    assert workload["allocatedGpuSeconds"] == 10
    assert workload["utilization"]["lifetime"] == 37.5
    assert workload["energyJoules"] == 1000  # 100 J/s x 10 s
    (project,) = report["projects"]
    assert project["name"] == "vision" and project["workloads"] == 1 and project["allocatedGpus"] == 1


def test_interval_and_idle_threshold_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path, [POD, _sample(0, 5), _sample(5, 5), _sample(10, 5)])
    code, out, _ = _replay(capsys, str(trace))
    assert code == 0
    assert json.loads(out)["workloads"][0]["unmonitoredGpuSeconds"] == 10  # 5 s steps > 3 x 1 s
    code, out, _ = _replay(capsys, str(trace), "--interval", "5s", "--idle-threshold-percent", "10")
    workload = json.loads(out)["workloads"][0]
    assert workload["unmonitoredGpuSeconds"] == 0
    assert workload["idleGpuSeconds"] == 10  # 5 % < 10 %
    code, out, _ = _replay(capsys, str(trace), "--at", "5")
    assert json.loads(out)["workloads"][0]["allocatedGpuSeconds"] == 5


def test_out_of_order_lines_are_placed_by_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [POD] + [_sample(t, 50 if t < 6 else 0) for t in range(0, 11)]
    in_order = _write(tmp_path, lines)
    code, expected, _ = _replay(capsys, str(in_order))
    shuffled_path = tmp_path / "shuffled.jsonl"
    shuffled = list(reversed(lines))
    shuffled_path.write_text("\n".join(json.dumps(line) for line in shuffled) + "\n")
    code, out, _ = _replay(capsys, str(shuffled_path))
    assert code == 0
    assert json.loads(out) == json.loads(expected)


@pytest.mark.parametrize(
    ("bad_line", "field"),
    [
        ("{not json", "<json>"),
        (json.dumps({"t": 1, "node": "n1"}), "event"),
        (json.dumps({**_sample(1, 10), "sm_percent": 150}), "sm_percent"),
        (json.dumps({**POD, "phase": "Sleeping"}), "phase"),
        (json.dumps({**POD, "devices": [{"uuid": "GPU-a", "units": 0}]}), "devices.0.units"),
        (json.dumps({**POD, "workload": {"kind": "Job", "name": "x", "uid": "u"}}), "workload.apiVersion"),
        (json.dumps({"t": "soon", "event": "namespace", "name": "ml"}), "t"),
        (json.dumps({"t": 1, "event": "party"}), "event"),
    ],
)
def test_malformed_line_names_line_and_field_exit_2_nothing_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_line: str, field: str
) -> None:
    trace = _write(tmp_path, [POD, _sample(0, 1), bad_line, _sample(2, 1)])
    code, out, err = _replay(capsys, str(trace))
    assert code == 2
    assert out == ""
    assert "line 3" in err
    assert f"'{field}'" in err


def test_missing_file_and_bad_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _replay(capsys, str(tmp_path / "nope.jsonl"))
    assert (code, out) == (2, "")
    assert "nope.jsonl" in err
    trace = _write(tmp_path, [POD])
    for option, value in (("--interval", "fast"), ("--idle-threshold", "250"), ("--at", "noon")):
        code, out, err = _replay(capsys, str(trace), option, value)
        assert (code, out) == (2, ""), option
        assert option in err


def test_console_script_runs(tmp_path: Path) -> None:
    trace = _write(tmp_path, [POD, _sample(0, 1), _sample(1, 1)])
    result = subprocess.run(
        [sys.executable, "-m", "gpuwm.cli", "replay", str(trace)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["workloads"][0]["name"] == "train"
    version = subprocess.run([sys.executable, "-m", "gpuwm.cli", "version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("gpuwm ")


def _pod_line(name: str, uuid: str, units: float) -> dict[str, Any]:
    return {
        "t": 0, "event": "pod", "namespace": "ml", "name": name, "uid": f"p-{name}", "phase": "Running", "node": "n1",
        "labels": {}, "workload": {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": f"w-{name}", "created": 0},
        "devices": [{"uuid": uuid, "units": units}],
    }


def test_replay_reads_a_busy_gpu_with_an_empty_process_list_as_busy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # DESIGN §3's attribution rule: a whole GPU held by one Job's pod computes at 80 % while NVML lists no
    # process (another PID namespace); a time-sliced GPU shared by two pods is busy with processes of no pod
    lines: list[Mapping[str, Any]] = [_pod_line("solo", "GPU-a", 1.0), _pod_line("x", "GPU-b::0", 0.5),
                                      _pod_line("y", "GPU-b::1", 0.5)]
    for t in range(0, 61):
        lines.append({"t": t, "event": "sample", "node": "n1", "uuid": "GPU-a", "sm_percent": 80, "processes": []})
        lines.append({"t": t, "event": "sample", "node": "n1", "uuid": "GPU-b", "sm_percent": 30,
                      "processes": [{"pid": 9, "sm_percent": 30}]})
    code, out, err = _replay(capsys, str(_write(tmp_path, lines)), "--at", "60")
    assert code == 0, err
    workloads = {item["name"]: item for item in json.loads(out)["workloads"]}
    assert workloads["solo"]["activeGpuSeconds"] == pytest.approx(60)
    assert workloads["solo"]["idleGpuSeconds"] == 0
    assert workloads["solo"]["idleSeconds"] == 0
    assert workloads["solo"]["utilization"]["lifetime"] == pytest.approx(80)
    for name in ("x", "y"):  # each holder gets the device's 30 %
        assert workloads[name]["activeGpuSeconds"] == pytest.approx(30)
        assert workloads[name]["utilization"]["lifetime"] == pytest.approx(30)
