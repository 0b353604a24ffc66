"""Run:ai names through the controller's `/metrics` on a real embedded store: `user` from
the `runaiUserLabel` pod label, runai_job_cpu_usage and runai_job_memory_used_bytes from the pods' kubelet
figures, free GPUs in the per-GPU and per-node series; and the setting's bad values refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.model import PodStatsSample
from gpuwm.model.figures import GpuFigures, PodFigures, WorkloadFigures
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import GIB, cluster, project, sample

TIMES = [float(t) for t in range(0, 120, 15)]


def job(name: str, gpu: str, user: str | None, ended: float | None = None) -> WorkloadFigures:
    labels = {"gpuwm.io/project": "alpha", **({"runai/user": user} if user else {})}
    return WorkloadFigures(
        uid=f"uid-{name}", namespace="team-a", name=name, kind="PyTorchJob", api_version="kubeflow.org/v1",
        project="alpha", phase="Running" if ended is None else "Succeeded", allocated_gpus=1.0,
        created_time=0.0, start_time=0.0, end_time=ended, nodes=["node-a"],
        pods=[PodFigures(name=f"{name}-master-0", uid=f"pod-{name}", node="node-a", phase="Running",
                         allocated_gpus=1.0, labels=labels)],
        gpus=[GpuFigures(node="node-a", uuid=gpu, index=int(gpu[-1]), units=1.0, utilization_percent=40.0,
                         sm_percent=40.0, pod=f"{name}-master-0", pod_uid=f"pod-{name}", namespace="team-a",
                         workload=name, workload_uid=f"uid-{name}", memory_used_bytes=10 * GIB,
                         memory_total_bytes=80 * GIB)],
    )


def stats(t: float, name: str, cpu: float, memory: float) -> PodStatsSample:
    return PodStatsSample(t=t, node="node-a", namespace="team-a", pod=f"{name}-master-0", pod_uid=f"pod-{name}",
                          cpu_usage_cores=cpu, memory_used_bytes=memory)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    """`train` (user alice) on gpu-0 and `tune` (no user label) on gpu-1; gpu-2 and gpu-3 free, gpu-3 idle at
    0 % and gpu-2 at 7 % (a process nobody's pod holds); `old` ended, its pod's stats stop."""
    opened = EmbeddedStore(tmp_path / "runai.db", tiers=["15s:1d"])
    for t in TIMES:
        running = [job("train", "gpu-0", "alice"), job("tune", "gpu-1", None)]
        shown = [*running, job("old", "gpu-9", "bob", ended=0.0)]
        samples = [sample(t, "gpu-0", sm=40.0), sample(t, "gpu-1", sm=40.0),
                   sample(t, "gpu-2", sm=7.0, used_gib=1.0), sample(t, "gpu-3", sm=0.0, used_gib=0.0)]
        pod_stats = [stats(t, "train", 1.5 + t / 1000, 3e9), stats(t, "tune", 0.5, 1e9)]
        opened.record(t, samples, shown, [project("alpha", running)], cluster(4), pod_stats)
    yield opened
    opened.close()


async def scrape(store: EmbeddedStore, **settings: object) -> dict[str, float]:
    app = create_app(store, Settings(auth="none", runai_compatible_metrics=True, cluster_id="c-1",
                                     status_interval=15.0, **settings))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in response.text.splitlines()
            if line.startswith("runai_")}


def workload_key(name: str, metric: str, user: str) -> str:
    return (f'{metric}{{clusterId="c-1",namespace="team-a",project="alpha",user="{user}",workload_id="uid-{name}",'
            f'workload_name="{name}",workload_type="training"}}')


async def test_user_comes_from_the_configured_pod_label(store: EmbeddedStore) -> None:
    values = await scrape(store, runai_user_label="runai/user")
    metric = "runai_allocated_gpu_count_per_workload"
    assert values[workload_key("train", metric, "alice")] == 1.0
    assert values[workload_key("tune", metric, "")] == 1.0  # its pod has no such label
    unset = await scrape(store)
    assert workload_key("train", metric, "") in unset and workload_key("train", metric, "alice") not in unset


async def test_cpu_and_memory_usage_per_workload_are_the_latest_host_figures(store: EmbeddedStore) -> None:
    values = await scrape(store, runai_user_label="runai/user")
    assert values[workload_key("train", "runai_job_cpu_usage", "alice")] == pytest.approx(1.5 + TIMES[-1] / 1000)
    assert values[workload_key("train", "runai_job_memory_used_bytes", "alice")] == 3e9
    assert values[workload_key("tune", "runai_job_cpu_usage", "")] == 0.5
    assert values[workload_key("tune", "runai_job_memory_used_bytes", "")] == 1e9
    assert not [key for key in values if "uid-old" in key and "runai_job_" in key]  # ended: no usage series


async def test_free_gpus_are_in_the_per_gpu_and_per_node_series(store: EmbeddedStore) -> None:
    values = await scrape(store)

    def gpu(metric: str, index: int) -> float | None:
        return values.get(f'{metric}{{clusterId="c-1",gpu="{index}",node="node-a",uuid="gpu-{index}"}}')

    assert [gpu("runai_allocated_gpu_count_per_gpu", i) for i in range(4)] == [1.0, 1.0, 0.0, 0.0]
    assert [gpu("runai_gpu_utilization_per_gpu", i) for i in range(4)] == [40.0, 40.0, 7.0, 0.0]
    assert [gpu("runai_gpu_memory_used_mebibytes_per_gpu", i) for i in range(4)] == [10240.0, 10240.0, 1024.0, 0.0]
    assert gpu("runai_gpu_memory_total_mebibytes_per_gpu", 3) == 80 * 1024.0
    assert gpu("runai_allocated_gpu_count_per_gpu", 9) is None  # the ended run's device is no device of the fleet
    node = '{clusterId="c-1",node="node-a"}'
    assert values[f"runai_allocated_gpu_count_per_node{node}"] == 2.0
    assert values[f"runai_gpu_utilization_per_node{node}"] == (40.0 + 40.0 + 7.0 + 0.0) / 4
    assert values[f"runai_gpu_memory_total_mebibytes_per_node{node}"] == 4 * 80 * 1024.0
    # a free GPU has no pod: the per-pod series name only the two held
    assert sum(1 for key in values if key.startswith("runai_allocated_gpu_count_per_pod{")) == 2


@pytest.mark.parametrize("key", ["Runai User", "-user", "a/b/c", "x" * 64, "UPPER.example/user"])
def test_a_bad_user_label_is_refused_by_name(key: str) -> None:
    with pytest.raises(ValidationError, match="runai_user_label") as raised:
        Settings(runai_user_label=key)
    assert "not a Kubernetes label key" in str(raised.value)


@pytest.mark.parametrize("key", ["", "user", "runai/user", "example.com/owner-name"])
def test_a_label_key_is_accepted(key: str) -> None:
    assert Settings(runai_user_label=key).runai_user_label == key


def test_the_setting_is_one_name_as_flag_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwm.cli import build_parser

    monkeypatch.setenv("GPUWM_RUNAI_USER_LABEL", "user")
    assert Settings().runai_user_label == "user"
    for verb in ("controller", "api"):
        assert build_parser().parse_args([verb, "--runai-user-label", "runai/user"]).runai_user_label == "runai/user"
