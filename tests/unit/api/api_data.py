"""A small populated embedded store for API tests: two projects, an active job and an idle notebook."""

from __future__ import annotations

from pathlib import Path

from gpuwm.model.figures import ClusterFigures
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import GIB, project, sample, workload

TIMES = [1005.0, 1020.0, 1035.0, 1050.0]


def populate(path: Path) -> EmbeddedStore:
    """train (team-a, project alpha): 2 GPUs at 40 % and 60 %; notebook (team-b, beta): 1 idle GPU on node-b."""
    store = EmbeddedStore(path)
    for index, t in enumerate(TIMES):
        train = workload(
            "train", [("gpu-0", 1.0, 40.0), ("gpu-1", 1.0, 60.0)], energy_joules=100.0 * (index + 1)
        )
        notebook = workload(
            "notebook",
            [("gpu-7", 1.0, 0.0)],
            namespace="team-b",
            project="beta",
            node="node-b",
            idle_seconds=600.0 + 15 * index,
        )
        notebook.idle_gpus = 1.0
        notebook.idle_gpu_seconds = 3600.0 * 3
        notebook.utilization.current = 0.0
        train.utilization.current = 50.0
        beta = project("beta", [notebook])
        beta.idle_gpus = 1.0
        beta.idle_gpu_seconds = 3600.0 * 3
        store.record(
            t,
            [
                sample(t, "gpu-0", sm=40, used_gib=10),
                sample(t, "gpu-1", sm=60, used_gib=20),
                sample(t, "gpu-7", node="node-b", sm=0, used_gib=5),
            ],
            [train, notebook],
            [project("alpha", [train]), beta],
            ClusterFigures(
                gpus=3, healthy_gpus=3, total_gpu_units=3.0, allocated_gpus=3.0, idle_gpus=1.0, workloads=2
            ),
        )
    return store


__all__ = ["GIB", "TIMES", "populate"]
