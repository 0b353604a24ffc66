"""Small hand-made figures for store and API tests (values chosen so expected results are exact)."""

from __future__ import annotations

from gpuwm.model import GpuSample
from gpuwm.model.figures import ClusterFigures, GpuFigures, PodFigures, ProjectFigures, WorkloadFigures

GIB = 1024.0**3


def sample(
    t: float, uuid: str, node: str = "node-a", sm: float = 50.0, used_gib: float = 10.0, **extra: object
) -> GpuSample:
    fields: dict[str, object] = {
        "t": t,
        "node": node,
        "uuid": uuid,
        "model": "NVIDIA H100",
        "index": int(uuid[-1]) if uuid[-1].isdigit() else 0,
        "sm_percent": sm,
        "memory_used_bytes": used_gib * GIB,
        "memory_total_bytes": 80 * GIB,
        "power_watts": 100.0 + sm,
        "power_limit_watts": 700.0,
        "energy_joules": 1000.0 + t,
        "temperature_celsius": 40.0 + sm / 10,
        "sm_clock_mhz": 1980.0,
        "memory_clock_mhz": 2619.0,
        "pcie_rx_bytes_per_second": 1000.0,
        "pcie_tx_bytes_per_second": 2000.0,
    }
    fields.update(extra)
    return GpuSample.model_validate(fields)


def workload(
    name: str,
    gpus: list[tuple[str, float, float | None]],
    *,
    namespace: str = "team-a",
    project: str = "alpha",
    node: str = "node-a",
    idle_seconds: float = 0.0,
    energy_joules: float = 0.0,
    created: float = 900.0,
    end_time: float | None = None,
    phase: str = "Running",
) -> WorkloadFigures:
    """A one-pod workload holding `gpus` as (uuid, units, utilization percent)."""
    pod_uid = f"pod-uid-{name}"
    return WorkloadFigures(
        uid=f"uid-{name}",
        namespace=namespace,
        name=name,
        kind="Job",
        api_version="batch/v1",
        project=project,
        phase=phase,
        allocated_gpus=sum(units for _, units, _ in gpus),
        idle_seconds=idle_seconds,
        energy_joules=energy_joules,
        created_time=created,
        start_time=created + 10,
        end_time=end_time,
        nodes=[node],
        pods=[
            PodFigures(
                name=f"{name}-0",
                uid=pod_uid,
                node=node,
                phase="Running",
                allocated_gpus=sum(units for _, units, _ in gpus),
            )
        ],
        gpus=[
            GpuFigures(
                node=node,
                uuid=uuid,
                units=units,
                utilization_percent=util,
                pod=f"{name}-0",
                pod_uid=pod_uid,
                namespace=namespace,
                workload=name,
                workload_uid=f"uid-{name}",
            )
            for uuid, units, util in gpus
        ],
    )


def project(name: str, workloads: list[WorkloadFigures], energy_joules: float = 0.0) -> ProjectFigures:
    return ProjectFigures(
        name=name,
        workloads=len(workloads),
        running_workloads=len(workloads),
        namespaces=sorted({w.namespace for w in workloads}),
        allocated_gpus=sum(w.allocated_gpus for w in workloads),
        energy_joules=energy_joules,
    )


def cluster(gpus: int) -> ClusterFigures:
    return ClusterFigures(gpus=gpus, healthy_gpus=gpus, total_gpu_units=float(gpus))
