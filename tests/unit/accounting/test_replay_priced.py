"""`gpuwm replay --pricing` equals a hand computation (whole, MIG and time-sliced GPUs, energy), and
`gpuwm replay --policy` lists what a policy would do on a trace, with times."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from gpuwm.cli import main

H100, A100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"
PRICES = {"currency": "EUR", "energyPricePerKwh": 0.25, "gpuModels": [
    {"model": "nvidia h100*", "pricePerGpuHour": 4.0},  # any case
    {"model": "NVIDIA A100*", "pricePerGpuHour": 2.8},  # the MIG instances' names start with their GPU's
    {"model": H100, "pricePerGpuHour": 99.0},  # an earlier rule wins
    {"model": L4, "pricePerGpuHour": 0.8},
]}
END = 1200
BUSY_UNTIL = 450
WATTS = 300.0


def _pod(name: str, devices: list[tuple[str, float]], t: float = 0.0, phase: str = "Running",
         kind: str = "Job", node: str = "n1") -> dict[str, Any]:
    return {"t": t, "event": "pod", "namespace": "ml", "name": name, "uid": f"pod-{name}", "phase": phase,
            "node": node, "workload": {"apiVersion": "batch/v1", "kind": kind, "name": name, "uid": f"wl-{name}",
                                       "created": 0},
            "devices": [{"uuid": uuid, "units": units} for uuid, units in devices]}


def priced_trace() -> list[dict[str, Any]]:
    """One project, four workloads for END seconds: a whole H100 (busy, then idle; its energy counted), a 1g.10gb
    MIG slice of an A100 (a seventh), and two pods holding a quarter each of a time-sliced L4."""
    lines: list[dict[str, Any]] = [{"t": 0, "event": "namespace", "name": "ml", "labels": {"gpuwm.io/project": "vision"}}]
    lines += [_pod("whole", [("GPU-h100", 1.0)]), _pod("slice", [("MIG-1g", 1 / 7)]),
              _pod("share-a", [("GPU-l4", 0.25)]), _pod("share-b", [("GPU-l4", 0.25)])]
    for t in range(-1, END + 1):
        lines.append({"t": t, "event": "sample", "node": "n1", "uuid": "GPU-h100", "model": H100,
                      "sm_percent": 80.0 if t <= BUSY_UNTIL else 0.0, "power_watts": WATTS,
                      "energy_joules": WATTS * (t + 1)})
        lines.append({"t": t, "event": "sample", "node": "n1", "uuid": "MIG-1g", "model": f"{A100} MIG 1g.10gb",
                      "parent_uuid": "GPU-a100", "mig_profile": "1g.10gb", "device_units": 1 / 7, "sm_percent": 0.0})
        lines.append({"t": t, "event": "sample", "node": "n1", "uuid": "GPU-l4", "model": L4, "sm_percent": 0.0,
                      "processes": []})
    lines += [_pod(name, [], t=END, phase="Succeeded") for name in ("whole", "slice", "share-a", "share-b")]
    return lines


def _write(tmp_path: Path, name: str, content: Any, lines: bool = False) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(line) for line in content) if lines else json.dumps(content))
    return path


def _run(capsys: pytest.CaptureFixture[str], *arguments: str) -> dict[str, Any]:
    code = main(["replay", *arguments])
    out, err = capsys.readouterr()
    assert code == 0, err
    parsed: dict[str, Any] = json.loads(out)
    return parsed


def test_priced_replay_equals_the_hand_computation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path, "trace.jsonl", priced_trace(), lines=True)
    pricing = _write(tmp_path, "pricing.json", PRICES)
    report = _run(capsys, str(trace), "--pricing", str(pricing), "--at", str(END))
    rows = {row["name"]: row for row in report["workloads"]}
    hours = END / 3600
    idle_hours = (END - BUSY_UNTIL) / 3600
    energy_cost = WATTS * END / 3.6e6 * 0.25  # joules -> kWh, priced
    expected = {
        # name: (units, price per GPU-hour, idle hours, energy cost)
        "whole": (1.0, 4.0, idle_hours, energy_cost),
        "slice": (1 / 7, 2.8, hours, 0.0),
        "share-a": (0.25, 0.8, hours, 0.0),
        "share-b": (0.25, 0.8, hours, 0.0),
    }
    for name, (units, price, idle, energy) in expected.items():
        row = rows[name]
        assert math.isclose(row["pricePerGpuHour"], price), name
        assert math.isclose(row["cost"], units * hours * price + energy, rel_tol=1e-9), (name, row["cost"])
        assert math.isclose(row["idleCost"], units * idle * price, rel_tol=1e-9), (name, row["idleCost"])
        assert math.isclose(row["energyCost"], energy, rel_tol=1e-9, abs_tol=1e-12), name
        assert row["costPerHour"] == 0  # ended: it holds nothing now
    (project,) = report["projects"]
    assert math.isclose(project["cost"], sum(rows[name]["cost"] for name in expected), rel_tol=1e-12)
    # the project's GPUs held and not used, apart: the H100's idle part, the slice and the L4 shares all along
    held_unused = 1.0 * idle_hours * 4.0 + (1 / 7) * hours * 2.8 + 0.5 * hours * 0.8
    assert math.isclose(project["idleCost"], held_unused, rel_tol=1e-9)
    assert report["currency"] == "EUR"


def test_cost_per_hour_is_what_is_held_now(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path, "trace.jsonl", priced_trace(), lines=True)
    pricing = _write(tmp_path, "pricing.json", PRICES)
    report = _run(capsys, str(trace), "--pricing", str(pricing), "--at", "600")
    rows = {row["name"]: row for row in report["workloads"]}
    assert math.isclose(rows["whole"]["costPerHour"], 4.0)
    assert math.isclose(rows["slice"]["costPerHour"], 2.8 / 7)
    assert math.isclose(rows["share-a"]["costPerHour"], 0.2)
    (project,) = report["projects"]
    # the H100 idle since 450, the slice and the shares idle: all of it held and unused now
    assert math.isclose(project["idleCostPerHour"], 4.0 + 0.4 + 0.4)


def test_unpriced_devices_have_no_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path, "trace.jsonl", priced_trace(), lines=True)
    pricing = _write(tmp_path, "pricing.yaml", {"pricing": {"gpuModels": [{"model": "NVIDIA H100*",
                                                                            "pricePerGpuHour": 4.0}]}})
    report = _run(capsys, str(trace), "--pricing", str(pricing), "--at", str(END))
    rows = {row["name"]: row for row in report["workloads"]}
    assert rows["whole"]["cost"] is not None and rows["slice"]["cost"] is None and rows["slice"]["idleCost"] is None
    (project,) = report["projects"]
    assert math.isclose(project["cost"], rows["whole"]["cost"])  # a sum over what is priced


def _notebook_trace() -> list[dict[str, Any]]:
    lines = [_pod("nb", [("GPU-l4", 1.0)], kind="Deployment")]
    lines += [{"t": t, "event": "sample", "node": "n1", "uuid": "GPU-l4", "model": L4,
               "sm_percent": 50.0 if t < 100 else 0.0} for t in range(-1, 1001)]
    return lines


POLICY = """
apiVersion: gpuwm.io/v1alpha1
kind: ClusterGPUIdlePolicy
metadata: {name: notebooks}
spec:
  idleFor: 5m
  selector: {excludeNamespaces: [prod]}
  actions:
    - type: warn
    - type: scaleToZero
      after: 2m
"""


def test_replay_lists_a_policys_steps_with_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path, "trace.jsonl", _notebook_trace(), lines=True)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    report = _run(capsys, str(trace), "--policy", str(policy), "--step", "10s")
    steps = [(step["t"], step["action"], step["workload"], step["dryRun"]) for step in report["actions"]]
    # last active in (98, 99]; evaluated every 10 s from the trace's first event (-1): warned at 399, once idle
    # 5 minutes, scaled down two minutes after the warning
    assert steps == [(399.0, "warn", "nb", True), (519.0, "scaleToZero", "nb", True)]
    assert report["actions"][0]["policy"] == "notebooks"


@pytest.mark.parametrize(("content", "message"), [
    ("kind: Deployment\n", "not a GPUIdlePolicy"),
    ("kind: GPUIdlePolicy\nmetadata: {name: p}\nspec: {idleFor: soon, actions: [{type: warn}]}\n", "spec.idleFor"),
    (": : :\n", "not YAML"),
])
def test_a_bad_policy_file_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                                message: str) -> None:
    trace = _write(tmp_path, "trace.jsonl", _notebook_trace(), lines=True)
    policy = tmp_path / "policy.yaml"
    policy.write_text(content)
    assert main(["replay", str(trace), "--policy", str(policy)]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_pricing_file_is_refused_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path, "trace.jsonl", _notebook_trace(), lines=True)
    pricing = _write(tmp_path, "pricing.json", {"gpuModels": [{"model": "x", "pricePerGpuHour": -1}]})
    assert main(["replay", str(trace), "--pricing", str(pricing)]) == 2
    assert "pricing.gpuModels.0.pricePerGpuHour" in capsys.readouterr().err
