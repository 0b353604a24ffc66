"""The runtime's offers carry hashes of a CR's signature and counters: the writer decides as it did with the tuples."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.status.build import workload_counters, workload_signature
from gpuwm.controller.status.idleness import ConditionStatus, idle_condition
from gpuwm.controller.status.writer import WORKLOAD_PLURAL, Written
from gpuwm.model.figures import PodFigures, WorkloadFigures

from .test_status import NOW, figures

KEY = (WORKLOAD_PLURAL, "ns", "train")


def _runtime(tmp_path: Path, clock: list[float]) -> ControllerRuntime:
    settings = Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9", status_interval=15)
    runtime = ControllerRuntime(settings, KubeClient("http://127.0.0.1:9"), clock=lambda: clock[0])
    runtime.writer._clock = lambda: clock[0]
    return runtime


def _offer(runtime: ControllerRuntime, workloads: list[WorkloadFigures], now: float,
           idle: dict[str, tuple[ConditionStatus, str]] | None = None) -> None:
    """What the cycle offers of `workloads` after its report."""
    runtime.offers.offer_workloads(runtime.state, workloads, now, slack_seconds=runtime.reporting_slack_seconds,
                                   policies=runtime.policies, idle=idle)


def _queued(runtime: ControllerRuntime) -> str:
    writer = runtime.writer
    return "material" if KEY in writer._material else "due" if KEY in writer._due or KEY in writer._stale else "none"


def _written(runtime: ControllerRuntime, at: float) -> None:
    """What the writer keeps once the queued offer went out."""
    writer = runtime.writer
    desired = writer._material.pop(KEY, None) or writer._due.pop(KEY, None) or writer._stale.pop(KEY)
    writer.written[KEY] = Written(signature=desired.signature, counters=desired.counters, at=at)


def test_offers_hold_hashes_and_the_writer_tells_news_refreshes_and_repeats_apart(tmp_path: Path) -> None:
    clock = [NOW]
    runtime = _runtime(tmp_path, clock)
    settings = runtime.settings
    first = figures()
    _offer(runtime, [first], NOW)
    desired = runtime.writer._material[KEY]
    assert desired.signature == hash(workload_signature(
        first, NOW, idle_condition_after_seconds=settings.idle_condition_after,
        underutilized_percent=settings.underutilized_percent, observed_idle_seconds=runtime.state.observed_idle.get("w1"),
        reporting_slack_seconds=runtime.reporting_slack_seconds))
    assert desired.counters == hash(workload_counters(first))
    assert isinstance(desired.signature, int) and isinstance(desired.counters, int)  # 8 bytes, not ~1 KB of tuples
    _written(runtime, NOW)

    _offer(runtime, [figures(idle_seconds=31.0)], NOW + 1)  # other objects, the same state: nothing to write
    assert _queued(runtime) == "none"
    moved = figures(allocated_gpu_seconds=130.0, idle_seconds=35.0)  # the same idle stretch, 5 s on
    _offer(runtime, [moved], NOW + 5)  # counters moved, within the interval: not yet
    assert _queued(runtime) == "none"
    clock[0] = NOW + 16
    moved = figures(allocated_gpu_seconds=130.0, idle_seconds=46.0)
    _offer(runtime, [moved], NOW + 16)  # ... and once the interval passed: a refresh
    assert _queued(runtime) == "due"
    _written(runtime, NOW + 16)
    pods = [PodFigures(name="train-0", uid="p1", node="n1", phase="Running", allocated_gpus=1.0)]
    _offer(runtime, [figures(pods=pods, allocated_gpus=1.0)], NOW + 17)  # a pod went: news at once
    assert _queued(runtime) == "material"


def test_the_cycles_idle_condition_is_the_one_the_signature_reads(tmp_path: Path) -> None:
    """The cycle computes each workload's Idle condition once and hands it to the signature: the same hash as the
    signature's own, and another condition is another signature."""
    runtime = _runtime(tmp_path, [NOW])
    idle = figures(idle_seconds=900.0)
    own = workload_signature(idle, NOW, idle_condition_after_seconds=600, observed_idle_seconds=900.0)
    given = idle_condition(idle, 900.0, 600, NOW)
    assert given[0] == "True"
    assert workload_signature(idle, NOW, idle_condition_after_seconds=600, observed_idle_seconds=900.0,
                              idle=given) == own
    assert workload_signature(idle, NOW, idle_condition_after_seconds=600, observed_idle_seconds=900.0,
                              idle=("False", "IdleBelowTimeout")) != own
    # no idleness observed by the runtime: only the condition handed over can say True
    _offer(runtime, [idle], NOW, {"w1": ("True", "IdleTooLong")})
    assert runtime.writer._material[KEY].signature == hash(workload_signature(
        idle, NOW, idle_condition_after_seconds=runtime.settings.idle_condition_after,
        underutilized_percent=runtime.settings.underutilized_percent, idle=("True", "IdleTooLong")))


def test_a_settled_workloads_status_is_rendered_from_the_offered_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished workload's figures are the engine's cached object: its write renders them as offered, without
    computing them again."""
    runtime = _runtime(tmp_path, [NOW])
    final = figures(phase="Succeeded", allocated_gpus=0.0, end_time=NOW - 60, pods=[], gpus=[])
    monkeypatch.setattr(runtime.engine, "settled_figures", lambda uid: final if uid == "w1" else None)

    def computed_again(uid: str, now: float | None = None) -> None:
        raise AssertionError("a settled workload's figures were computed again")

    monkeypatch.setattr(runtime.engine, "workload", computed_again)
    _offer(runtime, [final], NOW)
    status = runtime.writer._material[KEY].render()
    assert status["phase"] == "Succeeded" and status["allocatedGpuSeconds"] == final.allocated_gpu_seconds
