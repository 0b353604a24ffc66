"""The status cycle hands the embedded store its compaction slice apart, once the figures are released.

The store records the interval without the slice (`compact=False`) and runs it at the cycle's
end, when the report's figures are gone: a slice's arrays then reuse their memory. A store
without `compact_slice` records as before; a failing slice is logged and the next cycle goes on.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.model.figures import WorkloadFigures
from gpuwm.model.sample import GpuSample
from gpuwm.model.trace import DeviceAllocation, PodEvent, TraceWorkload


class _Store:
    """Records the calls, and how many of the interval's workload figures are still alive at the slice."""

    def __init__(self, *, fail_slice: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.alive_at_slice: list[int] = []
        self._figures: list[weakref.ref[WorkloadFigures]] = []
        self._fail_slice = fail_slice

    def record(self, at: float, samples: Sequence[GpuSample], workloads: Sequence[WorkloadFigures],
               projects: Sequence[Any], cluster: Any, pod_stats: Sequence[Any] = (), **options: Any) -> None:
        self.calls.append(("record", at, options))
        self._figures = [weakref.ref(figures) for figures in workloads]

    def compact_slice(self, at: float) -> None:
        self.calls.append(("compact_slice", at))
        self.alive_at_slice.append(sum(ref() is not None for ref in self._figures))
        if self._fail_slice:
            raise OSError("disk full")


class _RecordOnly:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def record(self, at: float, samples: Sequence[GpuSample], workloads: Sequence[WorkloadFigures],
               projects: Sequence[Any], cluster: Any, pod_stats: Sequence[Any] = ()) -> None:
        self.calls.append(("record", at, len(workloads)))


def _runtime(store: Any) -> tuple[ControllerRuntime, KubeClient]:
    settings = Settings(agents="static:n1=http://127.0.0.1:9", interval=10.0)
    client = KubeClient("http://127.0.0.1:9")
    runtime = ControllerRuntime(settings, client)
    runtime.store = store
    now = time.time()
    workload = TraceWorkload(api_version="batch/v1", kind="Job", name="train", uid="uid-train", created=now - 120)
    runtime.engine.observe_pod(PodEvent(
        t=now - 100, event="pod", namespace="ns", name="train-0", uid="pod-train", phase="Running", node="n1",
        labels={}, workload=workload, devices=[DeviceAllocation(uuid="GPU-a", units=1.0)]))
    for t in range(90, 0, -10):
        runtime.engine.observe_sample(GpuSample(t=now - t, node="n1", uuid="GPU-a", sm_percent=70.0))
    return runtime, client


async def _cycles(store: Any, count: int) -> ControllerRuntime:
    runtime, client = _runtime(store)
    try:
        for _ in range(count):
            await runtime.cycle()
    finally:
        await runtime.puller.close()
        await client.close()
    return runtime


async def test_the_slice_runs_after_the_record_once_the_figures_are_gone() -> None:
    store = _Store()
    await _cycles(store, 2)
    kinds = [call[0] for call in store.calls]
    assert kinds == ["record", "compact_slice", "record", "compact_slice"]
    assert all(call[2] == {"compact": False} for call in store.calls if call[0] == "record")
    assert store.calls[0][1] == store.calls[1][1]  # the slice of the interval just recorded
    assert store._figures and store.alive_at_slice == [0, 0]  # every workload's figures freed before it


async def test_a_store_without_slices_records_as_before() -> None:
    store = _RecordOnly()
    await _cycles(store, 1)
    assert [call[0] for call in store.calls] == ["record"] and store.calls[0][2] == 1


async def test_a_failed_slice_is_logged_and_the_cycle_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    store = _Store(fail_slice=True)
    runtime = await _cycles(store, 2)
    assert [call[0] for call in store.calls] == ["record", "compact_slice", "record", "compact_slice"]
    assert runtime.cycles == 2
    assert "store compaction failed: disk full" in caplog.text
