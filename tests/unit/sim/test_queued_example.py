"""README's worked example of `workload` trace events (examples/queued.jsonl) through `gpuwm replay`:
a job queued, admitted, preempted and admitted again, and one never admitted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwm.cli import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "queued.jsonl"


def _replayed(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["replay", str(EXAMPLE), "--at", "200"]) == 0
    answer: dict[str, Any] = json.loads(capsys.readouterr().out)
    return answer


def test_the_queued_example_gives_its_expected_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """Every field of examples/queued.expected.json, as `gpuwm replay` says (the file lists the fields
    the example is about; the README works them out)."""
    expected = json.loads((ROOT / "examples" / "queued.expected.json").read_text())
    got = _replayed(capsys)
    assert got["at"] == expected["at"]
    workloads = {w["name"]: w for w in got["workloads"]}
    assert set(workloads) == {w["name"] for w in expected["workloads"]}
    for want in expected["workloads"]:
        assert {key: workloads[want["name"]][key] for key in want} == want
    projects = {p["name"]: p for p in got["projects"]}
    for want in expected["projects"]:
        assert {key: projects[want["name"]][key] for key in want} == want


def test_the_readme_arithmetic_is_the_expected_file(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's sums (written by hand from the event times) are the figures replay gives."""
    workloads = {w["name"]: w for w in _replayed(capsys)["workloads"]}
    train, sweep = workloads["train"], workloads["sweep"]
    assert train["queuedSeconds"] == (30 - 0) + (130 - 100)
    assert train["waitSeconds"] == (40 - 0) + (150 - 100)
    assert train["allocatedGpuSeconds"] == 2 * ((100 - 40) + (200 - 150))
    assert sweep["queuedSeconds"] == sweep["waitSeconds"] == 200 - 50
    readme = (ROOT / "README.md").read_text()
    assert "examples/queued.jsonl" in readme and "queuedSeconds (0 → 30) + (100 → 130) = 60" in readme
