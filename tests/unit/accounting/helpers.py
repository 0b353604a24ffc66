"""Small builders for engine tests: events by keyword, figures by workload name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuwm.accounting import Engine, EngineConfig, SampleBatch
from gpuwm.accounting.state import sample_values
from gpuwm.model import GpuSample, NamespaceEvent, PodEvent
from gpuwm.model.figures import WorkloadFigures


def pod(
    t: float,
    name: str,
    phase: str = "Running",
    *,
    uid: str | None = None,
    namespace: str = "ml",
    node: str = "n1",
    devices: list[tuple[str, float]] | None = None,
    workload: str | None = None,
    kind: str = "Job",
    created: float | None = 0.0,
    labels: dict[str, str] | None = None,
) -> PodEvent:
    workload_name = workload or name
    return PodEvent.model_validate(
        {
            "t": t,
            "event": "pod",
            "namespace": namespace,
            "name": name,
            "uid": uid or f"pod-{name}",
            "phase": phase,
            "node": node,
            "labels": labels or {},
            "workload": {
                "apiVersion": "v1" if kind == "Pod" else "batch/v1",
                "kind": kind,
                "name": workload_name,
                "uid": f"wl-{workload_name}",
                "created": created,
            },
            "devices": [{"uuid": uuid, "units": units} for uuid, units in (devices or [("GPU-a", 1.0)])],
        }
    )


def sample(t: float, uuid: str = "GPU-a", sm: float | None = 0.0, **fields: Any) -> GpuSample:
    values: dict[str, Any] = {
        "t": t,
        "node": "n1",
        "uuid": uuid,
        "sm_percent": sm,
        "memory_used_bytes": 10.0,
        "memory_total_bytes": 100.0,
    }
    values.update(fields)
    return GpuSample.model_validate(values)


def namespace(t: float, name: str, labels: dict[str, str] | None = None, **annotations: str) -> NamespaceEvent:
    return NamespaceEvent.model_validate(
        {"t": t, "event": "namespace", "name": name, "labels": labels or {}, "annotations": annotations}
    )


def samples(start: int, end: int, uuid: str = "GPU-a", sm: float = 0.0, step: int = 1, **fields: Any) -> list[GpuSample]:
    """Samples at start, start+step, ..., end inclusive."""
    return [sample(float(t), uuid, sm, **fields) for t in range(start, end + 1, step)]


def engine(**config: Any) -> Engine:
    return Engine(EngineConfig(**config))


def figures(engine: Engine, name: str, now: float) -> WorkloadFigures:
    for item in engine.workloads(now):
        if item.name == name:
            return item
    raise AssertionError(f"no workload {name!r}; have {[w.name for w in engine.workloads(now)]}")


def batch_of_samples(samples: Sequence[GpuSample]) -> SampleBatch:
    """The batch `Engine.observe_samples` takes for these samples (the agent feed builds its own from columns)."""
    entries: dict[tuple[str, str, str | None, float], int] = {}
    device: list[int] = []
    rows = [sample_values(sample) for sample in samples]
    for sample in samples:
        key = (sample.uuid, sample.node, sample.parent_uuid, sample.device_units)
        device.append(entries.setdefault(key, len(entries)))
    keys = list(entries)
    return SampleBatch(
        uuids=[key[0] for key in keys], nodes=[key[1] for key in keys], parent_uuids=[key[2] for key in keys],
        device_units=[key[3] for key in keys], device=device, t=[row[0] for row in rows], sm=[row[1] for row in rows],
        memory=[row[2] for row in rows], energy=[row[3] for row in rows], pod_sm=[row[4] for row in rows],
        sample=samples.__getitem__, merged=[row[6] for row in rows] if any(row[6] for row in rows) else None,
    )
