"""Two controller replicas on a real kube-apiserver: exactly one leads, and a standby takes over when it stops.

Both replicas run `gpuwm controller` as the chart runs them (kopf peering, no priority given), beside a real
agent on the fake NVML whose GPU a Job's pod holds at 80 % SM. kopf pauses replicas that share a priority, so
without a priority of their own neither would ever write a GPUWorkloadMetrics. The replica started first
leads; the other waits. When the leader stops (SIGTERM, as a pod deletion) the standby writes the status
within one status interval of the leader's exit, plus its start (the state restored, the pods listed); when
the leader dies without a word (SIGKILL) its peering record goes stale after its lifetime first.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.envtest.conftest import make_namespace
from tests.envtest.controlplane import ControlPlane
from tests.envtest.gpunode import GpuNode, busy, create_job, epoch, job_pod, run_pod
from tests.fakenvml import build_fake_nvml
from tests.integration.test_controller import Controller, wait_until

pytestmark = pytest.mark.envtest

STATUS_INTERVAL = 5.0
#: a replica's start once it leads: the state restored, kopf's first listing of the pods, the first cycle's wait
START_SLACK_SECONDS = 4.0
#: kopf's peering record lifetime at this status interval (`this_replica`: a status interval, at least 10 s)
LIFETIME_SECONDS = 10.0
PEERING = "gpuwm-ha-test"
NAMESPACE = "ha"
STATE_SECRET = "gpuwm-ha-state"


@pytest.fixture
def node(control_plane: ControlPlane, crds: list[str], tmp_path: Path) -> Iterator[GpuNode]:
    gpu = GpuNode(control_plane, "gpu-ha", tmp_path, build_fake_nvml(tmp_path / "fakenvml"))
    yield gpu
    gpu.stop()


def _replica(plane: ControlPlane, node: GpuNode, directory: Path, name: str) -> Controller:
    """A replica as the chart runs it: peering on (no --standalone), no priority given, its own store."""
    directory.mkdir()
    replica = Controller(plane.write_kubeconfig(directory / "kubeconfig"), node.agents_flag(), directory / "gpuwm.db",
                         directory / "controller.log", status_interval=STATUS_INTERVAL, interval=0.5,
                         extra=("--standalone=false", "--peering-name", PEERING, "--state-secret", STATE_SECRET))
    replica.env["POD_NAMESPACE"] = NAMESPACE  # where the state Secret is, as the chart's downward API says
    return replica


def _records(plane: ControlPlane) -> dict[str, Any]:
    status, peering = plane.admin().request("GET", f"/apis/kopf.dev/v1/clusterkopfpeerings/{PEERING}")
    assert status == 200, peering
    return {identity: record for identity, record in (peering.get("status") or {}).items() if record}


def _cr(plane: ControlPlane) -> dict[str, Any] | None:
    status, body = plane.admin().request("GET", f"/apis/gpuwm.io/v1alpha1/namespaces/{NAMESPACE}/gpuworkloadmetrics/train")
    return body if status == 200 else None


def _written_after(plane: ControlPlane, moment: float, log: Path, timeout: float) -> dict[str, Any]:
    found: dict[str, Any] = wait_until(
        "a status written after the leader stopped",
        lambda: (cr := _cr(plane)) and epoch(cr["status"]["lastUpdateTime"]) > moment + 1 and cr,
        timeout=timeout, log=log)
    return found


def _leads(controller: Controller) -> bool:
    text = controller.log.read_text()
    return re.search(r"this replica \(\S+, priority -?\d+\) leads", text) is not None and "controller started" in text


def test_one_replica_leads_and_a_standby_takes_over(control_plane: ControlPlane, node: GpuNode,
                                                    tmp_path: Path) -> None:
    make_namespace(control_plane, NAMESPACE, {"gpuwm.io/project": "ha"})
    control_plane.admin().create("/apis/kopf.dev/v1/clusterkopfpeerings",
                                 {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                                  "metadata": {"name": PEERING}})
    node.create()
    node.set(busy(80.0))
    create_job(control_plane, NAMESPACE, "train", node.name)
    pod = job_pod(control_plane, NAMESPACE, "train")
    node.hold(pod)
    node.start()
    run_pod(control_plane, pod, float(int(time.time())))
    first, second = (_replica(control_plane, node, tmp_path / name, name) for name in ("first", "second"))
    first.start()
    time.sleep(1.0)  # the first replica started earlier: its derived priority is the higher one
    second.start()
    try:
        wait_until("the leader's figures", lambda: (cr := _cr(control_plane)) and
                   cr["status"].get("activeGpuSeconds", 0) >= 2, timeout=90, log=first.log)
        wait_until("both replicas' peering records", lambda: len(_records(control_plane)) == 2, log=second.log)
        assert _leads(first), first.log.read_text()[-3000:]
        assert "waits as a standby" in second.log.read_text() and not _leads(second), second.log.read_text()[-3000:]

        before = _written_after(control_plane, time.time(), first.log, timeout=3 * STATUS_INTERVAL)["status"]
        first.stop()  # SIGTERM, as a pod deletion: kopf removes its record on the way out
        stopped = time.time()
        handed = _written_after(control_plane, stopped, second.log, timeout=STATUS_INTERVAL + START_SLACK_SECONDS + 20)
        assert _leads(second), second.log.read_text()[-3000:]
        assert epoch(handed["status"]["lastUpdateTime"]) - stopped <= STATUS_INTERVAL + START_SLACK_SECONDS
        # the standby restored the leader's state from the Secret: the busy GPU's time goes on, none of it lost
        assert "engine state from Secret" in second.log.read_text(), second.log.read_text()[-3000:]
        after = _written_after(control_plane, stopped + 2 * STATUS_INTERVAL, second.log, timeout=4 * STATUS_INTERVAL)
        elapsed = epoch(after["status"]["lastUpdateTime"]) - epoch(before["lastUpdateTime"])
        gained = after["status"]["activeGpuSeconds"] - before["activeGpuSeconds"]
        assert gained == pytest.approx(elapsed, abs=3.0), (before, after["status"])
        assert after["status"]["unmonitoredGpuSeconds"] - before["unmonitoredGpuSeconds"] <= 3.0

        first.start()  # back as the younger replica: a standby now
        wait_until("the restarted replica waits", lambda: "waits as a standby" in first.log.read_text().split(
            "gpuwm controller started")[-1], log=first.log)
        second.kill()  # no word: its record stays until its lifetime ends
        killed = time.time()
        taken = _written_after(control_plane, killed, first.log,
                               timeout=LIFETIME_SECONDS + STATUS_INTERVAL + START_SLACK_SECONDS + 20)
        assert epoch(taken["status"]["lastUpdateTime"]) - killed <= (
            LIFETIME_SECONDS + STATUS_INTERVAL + START_SLACK_SECONDS)
        assert "Traceback" not in first.log.read_text() + second.log.read_text()
    finally:
        first.stop()
        second.stop()
