"""gpuwm end to end, as a user installs it: the image built from this checkout, the chart installed with
Helm's library and its default values (plus what a node without a GPU needs), a Job's pod holding one
GPU. The same code runs on the real node on this machine and on kind (tests/e2e/clusters.py).

The steps build on each other, in order; once one fails the later ones are skipped (conftest.py).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.clusters import APP_VERSION, FAKE_IMAGE, E2eCluster, NodeCluster
from tests.e2e.scene import (
    NAMESPACE,
    POWER_WATTS,
    RELEASE,
    STATUS_INTERVAL_SECONDS,
    WORKLOAD,
    WORKLOAD_NAMESPACE,
    Scene,
    epoch,
)

pytestmark = [pytest.mark.e2e, pytest.mark.incremental]

E2E = Path(__file__).parent
MONITORING_CRDS = E2E.parent / "chart" / "fixtures" / "monitoring.coreos.com-subset.yaml"
INTERVAL = STATUS_INTERVAL_SECONDS
#: what one status interval may leave uncounted or late: the interval, and the agent's buffer reads (5 s)
ONE_INTERVAL = INTERVAL + 5.0


@pytest.fixture(scope="module")
def scene(cluster: E2eCluster, e2e_helm_python: str) -> Iterator[Scene]:
    work = Path(tempfile.mkdtemp(prefix="gpuwm-e2e-work-"))
    made = Scene(cluster, e2e_helm_python, work)
    try:
        yield made
    finally:
        for namespace in (WORKLOAD_NAMESPACE, NAMESPACE):
            cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "clusterkopfpeering", RELEASE, "--ignore-not-found", check=False)
        print(f"\ne2e timings (s): {made.timings}")


def test_the_image_builds_and_the_chart_installs(scene: Scene) -> None:
    cluster = scene.cluster
    left = scene.clear_leftovers()
    if left:
        print(f"\nnamespaces {left} were left by an earlier run on this cluster: deleted")
    started = time.monotonic()
    cluster.build_images()
    scene.timings["build"] = time.monotonic() - started
    if isinstance(cluster, NodeCluster):
        print(f"\nimage {APP_VERSION}: {cluster.image_size()}")
    cluster.kubectl("label", "node", cluster.node_name, "nvidia.com/gpu.present=true", "--overwrite")
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
    scene.set_gpu(0.0)
    started = time.monotonic()
    answer = scene.helm("install", values={})
    scene.timings["install"] = time.monotonic() - started
    assert answer["result"].get("status", "deployed") in {"deployed", "DEPLOYED"}, answer


def test_both_controller_replicas_start_and_exactly_one_leads(scene: Scene) -> None:
    scene.wait("2 controller replicas and the agent ready", lambda: len(scene.ready("controller")) == 2
               and len(scene.ready("agent")) == 1, timeout=180)
    leaders = scene.wait("one leader", lambda: scene.leaders(), timeout=60)
    assert len(leaders) == 1, leaders
    standby = next(pod["metadata"]["name"] for pod in scene.pods("controller")
                   if pod["metadata"]["name"] != leaders[0])
    assert "waits as a standby" in scene.logs(standby), scene.logs(standby)
    assert "controller started" in scene.logs(leaders[0])
    peering = scene.cluster.json("get", "clusterkopfpeering", RELEASE)
    assert len([record for record in (peering.get("status") or {}).values() if record]) == 2, peering
    slices = scene.cluster.json("-n", NAMESPACE, "get", "endpointslices",
                                "-l", f"kubernetes.io/service-name={RELEASE}-controller")["items"]
    routed = {endpoint["targetRef"]["name"] for s in slices for endpoint in s.get("endpoints") or []}
    assert routed == {leaders[0]}, f"the API's Service routes to {routed}, not only to the leader {leaders[0]}"


def test_the_image_runs_gpuwm_and_not_as_root(scene: Scene) -> None:
    controller = scene.pods("controller")[0]["metadata"]["name"]
    version = scene.cluster.kubectl("-n", NAMESPACE, "exec", controller, "--", "gpuwm", "version").stdout
    assert version.strip() == f"gpuwm {APP_VERSION}"
    assert scene.cluster.kubectl("-n", NAMESPACE, "exec", controller, "--", "id", "-u").stdout.strip() == "65532"


def test_a_gpu_pods_metrics_count_active_then_idle(scene: Scene) -> None:
    cluster = scene.cluster
    manifest = (E2E / "workload.yaml").read_text().replace("image: IMAGE", f"image: {FAKE_IMAGE}")
    cluster.kubectl("apply", "-f", "-", stdin=manifest)
    pod = scene.wait("the Job's pod running", lambda: [p for p in cluster.json(
        "-n", WORKLOAD_NAMESPACE, "get", "pods", "-l", f"batch.kubernetes.io/job-name={WORKLOAD}")["items"]
        if p["status"].get("phase") == "Running" and p["status"].get("containerStatuses")], timeout=120)[0]
    if cluster.device_ids:  # the device plugin's choice, as the kubelet's pod-resources API reports it
        scene.gpu = cluster.kubectl("-n", WORKLOAD_NAMESPACE, "exec", pod["metadata"]["name"], "--", "printenv",
                                    "NVIDIA_VISIBLE_DEVICES").stdout.strip()
        assert scene.gpu in cluster.device_ids
    scene.pid = cluster.host_pid(pod["status"]["containerStatuses"][0]["containerID"])
    scene.set_gpu(60.0)
    busy = scene.wait("the Job active", lambda: (cr := scene.cr()) and cr.get("status", {}).get(
        "activeGpuSeconds", 0) >= INTERVAL and cr, timeout=120)
    assert busy["spec"]["project"] == "e2e-project"
    assert busy["spec"]["workloadRef"]["kind"] == "Job"
    status = busy["status"]
    assert status["allocatedGpus"] == 1 and status["phase"] == "Running"
    assert [gpu["uuid"] for gpu in status["gpus"]] == [scene.gpu]
    later = scene.written_after(epoch(status["lastUpdateTime"]) + INTERVAL, timeout=4 * INTERVAL)
    elapsed = epoch(later["lastUpdateTime"]) - epoch(status["lastUpdateTime"])
    assert later["activeGpuSeconds"] - status["activeGpuSeconds"] == pytest.approx(elapsed, abs=ONE_INTERVAL)
    assert later["idleGpuSeconds"] == 0

    scene.set_gpu(0.0)
    idled = scene.wait("the Job idle", lambda: scene.status()["idleGpuSeconds"] >= 2 * INTERVAL
                       and scene.status(), timeout=6 * INTERVAL)
    assert idled["activeGpuSeconds"] <= later["activeGpuSeconds"] + ONE_INTERVAL
    assert idled["utilization"]["current"] == 0
    scene.set_gpu(60.0)


def test_the_api_answers_over_https_to_a_token_for_its_audience(scene: Scene) -> None:
    cluster = scene.cluster
    for_gpuwm = cluster.kubectl("-n", WORKLOAD_NAMESPACE, "create", "token", "metrics-reader",
                                "--audience", "gpuwm").stdout.strip()
    for_the_api_server = cluster.kubectl("-n", WORKLOAD_NAMESPACE, "create", "token", "metrics-reader").stdout.strip()
    path = f"/api/v1/namespaces/{WORKLOAD_NAMESPACE}/workloads/{WORKLOAD}"
    with scene.api() as get:
        assert get(path)[0] == 401
        assert get(path, for_the_api_server)[0] == 401  # a token for another audience is refused
        status, body = get(path, for_gpuwm)
        assert status == 200 and f'"{WORKLOAD}"' in body, body
        status, body = get(f"{path}/metrics?metric=gpu_utilization_percent&step=15s", for_gpuwm)
        assert status == 200 and '"series"' in body, body


def _figures(status: dict[str, Any]) -> dict[str, float]:
    """The additive figures, when they were written (`at`) and the end of the latest sample counted (`sampled`:
    the GPU is busy, so lastActiveTime; the time after it counts unmonitored until the next samples come)."""
    return {key: float(status[key]) for key in ("allocatedGpuSeconds", "activeGpuSeconds", "idleGpuSeconds",
                                                 "unmonitoredGpuSeconds", "energyJoules")} | {
        "at": epoch(status["lastUpdateTime"]), "sampled": epoch(status["lastActiveTime"])}


def test_a_killed_controller_loses_nothing(scene: Scene) -> None:
    """The leader's pod deleted: the standby leads, restores the state and counts on; the GPU busy throughout."""
    before = _figures(scene.written_after(time.time(), timeout=3 * INTERVAL))
    (leader,) = scene.leaders()
    deleted = time.time()
    scene.cluster.kubectl("-n", NAMESPACE, "delete", "pod", leader, "--wait=false")
    new_leader = scene.wait("another replica leading", lambda: [p for p in scene.leaders() if p != leader],
                            timeout=60, every=0.5)
    scene.timings["hand-over"] = time.time() - deleted
    after = _figures(scene.written_after(deleted + 2 * INTERVAL, timeout=6 * INTERVAL))
    elapsed = after["at"] - before["at"]
    gained = {key: after[key] - before[key] for key in before}
    print(f"\ncontroller kill: {leader} -> {new_leader}, hand-over {scene.timings['hand-over']:.1f} s, "
          f"elapsed {elapsed:.1f} s, gained {gained}")
    assert "engine state from Secret" in scene.logs(new_leader[0], 400), scene.logs(new_leader[0], 400)
    assert gained["allocatedGpuSeconds"] == pytest.approx(elapsed, abs=ONE_INTERVAL)
    assert gained["unmonitoredGpuSeconds"] <= ONE_INTERVAL
    assert gained["idleGpuSeconds"] == 0
    # nothing lost: every second up to the latest sample is active (whole seconds in the status: +-1 each end)
    assert gained["activeGpuSeconds"] == pytest.approx(gained["sampled"], abs=2.0)
    assert gained["energyJoules"] == pytest.approx(POWER_WATTS * gained["sampled"], abs=POWER_WATTS * 2.0)
    scene.wait("the deleted replica replaced", lambda: len(scene.ready("controller")) == 2, timeout=180)


def test_a_killed_agent_leaves_unmonitored_time_never_idle(scene: Scene) -> None:
    before = scene.written_after(time.time(), timeout=3 * INTERVAL)
    (agent,) = [pod["metadata"]["name"] for pod in scene.pods("agent")]
    deleted = time.time()
    scene.cluster.kubectl("-n", NAMESPACE, "delete", "pod", agent, "--wait=false")
    scene.wait("the agent back", lambda: [p for p in scene.ready("agent") if p["metadata"]["name"] != agent],
               timeout=180, every=1.0)
    down = time.time() - deleted
    scene.timings["agent down"] = down
    after = scene.written_after(time.time() + 2 * INTERVAL, timeout=6 * INTERVAL)
    unmonitored = after["unmonitoredGpuSeconds"] - before["unmonitoredGpuSeconds"]
    print(f"\nagent kill: down {down:.1f} s, unmonitored +{unmonitored:.1f} GPU-s")
    assert unmonitored >= 3.0, (before, after)  # the agent's restart: no samples
    assert after["idleGpuSeconds"] == before["idleGpuSeconds"], "time without samples was counted idle"
    assert not any(c["type"] == "Idle" and c["status"] == "True" for c in after["conditions"])
    split = after["activeGpuSeconds"] + after["idleGpuSeconds"] + after["unmonitoredGpuSeconds"]
    assert split == pytest.approx(after["allocatedGpuSeconds"], abs=0.01)


def test_helm_upgrade_to_the_next_chart_version_with_every_monitoring_object(scene: Scene) -> None:
    cluster = scene.cluster
    cluster.kubectl("apply", "--server-side", "-f", str(MONITORING_CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "crd", "prometheusrules.monitoring.coreos.com",
                    "servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com", "--timeout=60s")
    before = scene.status()
    answer = scene.helm("upgrade", scene.copy_chart("0.1.1"), values={
        "prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True},
        "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})
    assert answer["result"].get("version", 2) == 2, answer
    deployment = cluster.json("-n", NAMESPACE, "get", "deployment", f"{RELEASE}-controller")
    assert deployment["metadata"]["labels"]["helm.sh/chart"] == "gpuwm-0.1.1"
    for kind in ("prometheusrule", "servicemonitor", "podmonitor"):
        assert cluster.json("-n", NAMESPACE, "get", kind)["items"], f"no {kind} after the upgrade"
    dashboards = cluster.json("-n", NAMESPACE, "get", "configmap", "-l", "grafana_dashboard=1")["items"]
    assert dashboards and "gpuwm.json" in dashboards[0]["data"]
    after = scene.written_after(time.time() + INTERVAL, timeout=6 * INTERVAL)
    assert after["allocatedGpuSeconds"] > before["allocatedGpuSeconds"]
    assert len(scene.leaders()) == 1


def test_helm_uninstall_keeps_the_crds_and_the_metrics(scene: Scene) -> None:
    cluster = scene.cluster
    scene.helm("uninstall", wait_seconds=180)
    scene.wait("the controller and agents gone", lambda: not scene.pods("controller") and not scene.pods("agent"),
               timeout=180)
    for crd in ("gpuworkloadmetrics.gpuwm.io", "gpuprojectmetrics.gpuwm.io", "clusterkopfpeerings.kopf.dev"):
        assert cluster.kubectl("get", "crd", crd, check=False).returncode == 0, f"uninstall removed CRD {crd}"
    kept = scene.cr()
    assert kept is not None and kept["status"]["allocatedGpuSeconds"] > 0
