"""`gpuwm demo` options: trace writing, and errors that name the option at fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwm.cli import main
from gpuwm.model.trace import parse_trace_line


def test_write_trace_and_truth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, truth = tmp_path / "run.jsonl", tmp_path / "truth.json"
    arguments = ["demo", "--write-trace", str(trace), "--write-truth", str(truth), "--duration", "5m",
                 "--nodes", "3", "--gpus-per-node", "2", "--interval", "5s", "--seed", "8", "--faults"]
    assert main(arguments) == 0
    assert "gpuwm replay" in capsys.readouterr().err
    lines = trace.read_text().splitlines()
    events = [parse_trace_line(line, number) for number, line in enumerate(lines, start=1)]
    assert {event.event for event in events} == {"namespace", "pod", "workload", "sample"}
    assert events[-1].t == 300.0
    report = json.loads(truth.read_text())
    assert report["seed"] == 8 and report["at"] == 300.0 and report["workloads"]
    assert any(w["unmonitoredGpuSeconds"] > 0 for w in report["workloads"])  # --faults
    first = trace.read_bytes()
    assert main(arguments) == 0
    assert trace.read_bytes() == first


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--nodes", "0"], "--nodes"),
        (["--gpus-per-node", "17"], "--gpus-per-node"),
        (["--speed", "0"], "--speed"),
        (["--warmup", "soon"], "--warmup"),
        (["--interval", "fast"], "--interval"),
        (["--listen", "localhost"], "--listen"),
        (["--write-trace", "/nonexistent-dir/x.jsonl", "--duration", "10s"], "--write-trace"),
    ],
)
def test_bad_options_exit_2_naming_the_option(
    arguments: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *arguments]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("arguments", [["--store-rollups", "15x:2d"], ["--listen", "127.0.0.1:99999"]])
def test_a_failed_demo_leaves_no_temporary_folder(arguments: list[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's store lives in a temporary folder when --store is not given: a start that fails removes it."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["demo", "--no-table", *arguments]) == 2
    assert arguments[0] in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
