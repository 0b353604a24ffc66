"""The status bodies the writer sends (`workload_status_body`, `project_status_body`) equal the pydantic ones.

Old path: `build_workload_status(...).model_dump(mode="json", by_alias=True)`; new path: the
dict built directly. Compared on the engine's figures of random traces and on awkward
hand-made ones (NaN, ints from a CR baseline, lists past MAX_LISTED, unknown phases, earlier
conditions): the same keys in the same order, the same values and types, the same bytes.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gpuwm.accounting import Engine
from gpuwm.controller.status.build import (
    build_conditions,
    build_project_status,
    build_workload_status,
    project_status_body,
    workload_status_body,
)
from gpuwm.model.crd import MAX_LISTED, Condition
from gpuwm.model.figures import GpuFigures, PodFigures, ProjectFigures, Windows, WorkloadFigures
from tests.unit.accounting.test_properties import HORIZON, PROPERTY_SETTINGS, Event, traces

NOW = 1_767_225_600.0


def _same(left: Any, right: Any, path: str = "") -> None:
    """Equal with the same types and key order; NaN equals NaN."""
    assert type(left) is type(right), (path, left, right)
    if isinstance(left, dict):
        assert list(left) == list(right), path
        for key in left:
            _same(left[key], right[key], f"{path}.{key}")
    elif isinstance(left, list):
        assert len(left) == len(right), path
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            _same(a, b, f"{path}[{index}]")
    elif isinstance(left, float) and math.isnan(left):
        assert math.isnan(right), path
    else:
        assert left == right, path


def _check_workload(figures: WorkloadFigures, now: float, previous: list[Condition] | None = None,
                    **kwargs: Any) -> list[Condition]:
    old = build_workload_status(figures, now, previous_conditions=previous or (), **kwargs)
    body, conditions = workload_status_body(figures, now, previous_conditions=previous or (), **kwargs)
    _same(body, old.model_dump(mode="json", by_alias=True))
    assert conditions == old.conditions
    assert orjson.dumps(body) == orjson.dumps(old.model_dump(mode="json", by_alias=True))
    return conditions


def _check_project(figures: ProjectFigures, now: float, generation: int | None = None) -> None:
    old = build_project_status(figures, now, observed_generation=generation).model_dump(mode="json", by_alias=True)
    body = project_status_body(figures, now, observed_generation=generation)
    _same(body, old)
    assert orjson.dumps(body) == orjson.dumps(old)


@PROPERTY_SETTINGS
@given(traces(), st.sampled_from([0.0, 5.0, 600.0]), st.sampled_from([20.0, 50.0]))
def test_bodies_of_engine_figures_equal_the_pydantic_dumps(events: list[Event], idle_after: float, low: float) -> None:
    engine = Engine()
    for event in events:
        engine.observe(event)
    previous: dict[str, list[Condition]] = {}
    for offset in (HORIZON / 2, HORIZON + 5.0, HORIZON + 700.0):
        now = NOW + offset  # epoch-like times, as the controller's
        workloads, projects, _cluster = engine.report(offset)
        for figures in workloads:
            previous[figures.uid] = _check_workload(figures, now, previous.get(figures.uid),
                                                    idle_condition_after_seconds=idle_after, underutilized_percent=low)
        for project in projects:
            _check_project(project, now, generation=3)


def _awkward() -> WorkloadFigures:
    return WorkloadFigures(
        uid="w", namespace="ns", name="n", kind="Job", api_version="batch/v1", project="p", phase="Running",
        allocated_gpus=2.0, idle_seconds=700.0, last_active_time=NOW - 700.4, start_time=NOW - 1000.6,
        utilization=Windows(current=math.nan, avg1m=12.3456, avg1h=3.0), memory_utilization=Windows(lifetime=99.999),
        sampling=False, nodes=["n2", "n1"], gpu_model="H100",
        pods=[PodFigures(name=f"p{index:03d}", uid=f"u{index}", phase="Running", allocated_gpus=1 / 3)
              for index in range(MAX_LISTED + 5, 0, -1)],
        gpus=[GpuFigures(node=f"n{index % 3}", uuid=f"GPU-{index}", units=1 / 7, index=index, power_watts=math.nan,
                         utilization_percent=None if index % 2 else 12.345678, memory_used_bytes=4e10,
                         memory_total_bytes=8e10, monitored=index % 5 != 0, healthy=index % 7 != 0,
                         pod=None if index % 4 else f"p{index}")
              for index in range(MAX_LISTED + 3)],
    )


def test_awkward_figures_and_earlier_conditions() -> None:
    figures = _awkward()
    conditions = _check_workload(figures, NOW)
    # the transition times stay where the status did not move
    conditions = _check_workload(figures.model_copy(update={"idle_seconds": 5.0}), NOW + 60, conditions)
    _check_workload(figures, NOW + 120, conditions, observed_generation=7)


def test_ints_from_a_cr_baseline_are_sent_as_floats() -> None:
    # the controller adds what a CR said before a restart (JSON numbers, maybe ints) to the figures
    figures = _awkward().model_copy(update={"allocated_gpu_seconds": 100, "wait_seconds": 30, "run_seconds": 5,
                                            "energy_joules": 0, "idle_gpu_seconds": 3600, "start_time": 1_700_000_000})
    _check_workload(figures, NOW)
    project = ProjectFigures(name="p", workloads=2, namespaces=["b", "a"], quota=4.0).model_copy(
        update={"allocated_gpu_seconds": 100, "idle_gpu_seconds": 7, "quota": 4})
    _check_project(project, NOW)


def test_unknown_phase_and_ended_workload() -> None:
    for phase in ("Weird", "Succeeded", "Ended", "Pending"):
        figures = _awkward().model_copy(update={"phase": phase, "allocated_gpus": 0.0, "end_time": NOW - 5.5,
                                                "pods": [], "gpus": []})
        _check_workload(figures, NOW)
    conditions = build_conditions(_awkward(), NOW)
    assert [condition.type for condition in conditions] == ["Sampling", "Idle", "Underutilized"]
