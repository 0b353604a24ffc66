"""The clusters the e2e tier runs on: a real node on this machine (`../shared/envtest/node.sh`), or kind.

Both build the image and its fake-NVML variant from the checkout, put them where the kubelet finds them
without a registry, and make one node look like a GPU node to a user's `helm install`: the NVIDIA
feature-discovery label, `nvidia.com/gpu` capacity, and a folder on the node for the fake NVML's
scenario. The checks in test_e2e.py see only this interface, so both paths run the same test code.

- `NodeCluster`: kubelet, containerd, runc, CNI, scheduler, kube-proxy and a fake `nvidia.com/gpu`
  device plugin beside a real control plane (node.sh's NODE.md); images built with buildah on a
  debootstrap base tagged as the Dockerfile's base, loaded into the node's containerd. The device
  plugin gives the pod its device, and the kubelet's pod-resources API tells the agent.
- `KindCluster`: docker and kind (`kind-config.yaml`); the GPU capacity is patched onto the worker
  (no device plugin), so the agent finds the pod's process through its cgroup.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
E2E = Path(__file__).parent
APP_VERSION = next(line.split(":", 1)[1].strip().strip('"') for line in (ROOT / "charts" / "gpuwm" / "Chart.yaml")
                   .read_text().splitlines() if line.startswith("appVersion:"))
REPOSITORY = "ghcr.io/gpuwm/gpuwm"
IMAGE = f"{REPOSITORY}:{APP_VERSION}"
FAKE_TAG = f"{APP_VERSION}-fakenvml"
FAKE_IMAGE = f"{REPOSITORY}:{FAKE_TAG}"


@dataclass
class E2eCluster:
    """What the checks need of a cluster: kubectl, the images, a GPU node, the holder's host PID."""

    kubeconfig: Path
    kubectl_path: str
    node_name: str
    #: folder on this machine whose files the agent reads at /var/lib/gpuwm-e2e (the fake NVML's scenario)
    scenario_dir: Path
    #: where the kubelet's pod-resources socket folder is on the node ("" for the chart's default)
    pod_resources_host_path: str = ""
    #: UUIDs of the GPUs the device plugin hands out (none: kind has no device plugin)
    device_ids: list[str] = field(default_factory=list)

    def kubectl(self, *arguments: str, check: bool = True, timeout: float = 120,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *arguments], input=stdin,
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(arguments)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done

    def json(self, *arguments: str) -> Any:
        return json.loads(self.kubectl(*arguments, "-o", "json").stdout)

    def build_images(self) -> None:
        raise NotImplementedError

    def host_pid(self, container_id: str) -> int:
        """The host PID of a container's first process, from its `containerd://ID` in the pod's status."""
        raise NotImplementedError

    def chart_values(self) -> dict[str, Any]:
        """What a GPU-less node needs on top of the chart's defaults: the local image and the fake NVML."""
        values: dict[str, Any] = {
            "image": {"tag": FAKE_TAG, "pullPolicy": "Never"},
            "kubeletInsecureTls": True,  # the kubelet's self-signed serving certificate (stats summary)
            "agent": {
                "extraEnv": [{"name": "LD_LIBRARY_PATH", "value": "/opt/fakenvml"},
                             {"name": "FAKE_NVML_SCENARIO", "value": "/var/lib/gpuwm-e2e/scenario"}],
                "extraVolumes": [{"name": "fake-nvml-scenario",
                                  "hostPath": {"path": str(self.scenario_dir), "type": "Directory"}}],
                "extraVolumeMounts": [{"name": "fake-nvml-scenario", "mountPath": "/var/lib/gpuwm-e2e",
                                       "readOnly": True}],
            },
        }
        if self.pod_resources_host_path:
            values["agent"]["podResourcesHostPath"] = self.pod_resources_host_path
        return values

    def stop(self) -> None:
        """Undo what the tier made here (the node itself is .ci/run's or the developer's to stop)."""


def _pip_settings() -> list[str]:
    """buildah -v options giving the build the host's pip index and CA bundle (a TLS-intercepting proxy)."""
    options: list[str] = []
    bundle = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
    if not bundle.exists():
        return options
    folder = Path(tempfile.mkdtemp(prefix="gpuwm-e2e-pip-"))
    lines = ["[global]", "cert = /etc/ssl/certs/host-ca.crt"]
    index = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True,
                           text=True)
    if index.returncode == 0 and index.stdout.strip().startswith("http"):
        lines.append(f"index-url = {index.stdout.strip()}")
    (folder / "pip.conf").write_text("\n".join(lines) + "\n")
    return ["-v", f"{folder / 'pip.conf'}:/etc/pip.conf:ro", "-v", f"{bundle}:/etc/ssl/certs/host-ca.crt:ro"]


@dataclass
class NodeCluster(E2eCluster):
    node_sh: Path = Path()
    containerd_socket: str = ""

    @classmethod
    def connect(cls, node_sh: Path, scenario_dir: Path) -> NodeCluster:
        """The running node (`node.sh start`); raises RuntimeError naming what is missing."""
        status = subprocess.run([str(node_sh), "status"], capture_output=True, text=True, timeout=60)
        if "readyz: ok" not in status.stdout or "kubelet: running" not in status.stdout:
            raise RuntimeError(f"the node is not running ({node_sh} status): start it with `{node_sh} setup` "
                               f"and `{node_sh} start`")
        found = dict(line.split("=", 1) for line in subprocess.run(
            [str(node_sh), "env"], capture_output=True, text=True, check=True, timeout=60).stdout.split() if "=" in line)
        state = Path(os.environ.get("NODE_STATE", "/tmp/gpuwm-node"))
        ids = os.environ.get("DEVICE_IDS", "GPU-00000000-0000-4000-8000-000000000000,"
                                           "GPU-00000000-0000-4000-8000-000000000001").split(",")
        return cls(kubeconfig=Path(found["KUBECONFIG"]), kubectl_path=found["KUBECTL"], node_name=found["NODE_NAME"],
                   scenario_dir=scenario_dir, pod_resources_host_path=str(state / "kubelet" / "pod-resources"),
                   device_ids=ids, node_sh=node_sh, containerd_socket=found["CONTAINERD_SOCK"])

    def _node(self, *arguments: str, timeout: float = 1200) -> str:
        done = subprocess.run([str(self.node_sh), *arguments], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"node.sh {' '.join(arguments[:3])} failed ({done.returncode}):\n"
                                 f"{(done.stdout + done.stderr)[-4000:]}")
        return done.stdout

    def build_images(self) -> None:
        """buildah on the debootstrap base the node tags as python:3.11-slim-bookworm; no registry, no Docker.

        GPUWM_E2E_SKIP_BUILD=1 loads the images the last run built (a developer's loop on the test code)."""
        if os.environ.get("GPUWM_E2E_SKIP_BUILD") == "1":
            self._node("load", IMAGE, FAKE_IMAGE)
            return
        pip = _pip_settings()
        self._node("buildah", "bud", "--pull=never", "--network", "host", *pip, "-t", IMAGE, str(ROOT))
        self._node("buildah", "bud", "--pull=never", "--network", "host", "--build-arg", f"BASE={IMAGE}",
                   "-t", FAKE_IMAGE, "-f", str(E2E / "Dockerfile.fakenvml"), str(ROOT / "tests" / "fakenvml"))
        self._node("load", IMAGE, FAKE_IMAGE)

    def image_size(self) -> str:
        """The image's size as buildah reports it (e.g. "376 MB")."""
        images = json.loads(self._node("buildah", "images", "--json", IMAGE) or "[]")
        return str(images[0].get("size", "?")) if images else "?"

    def host_pid(self, container_id: str) -> int:
        tasks = subprocess.run(["ctr", "--address", self.containerd_socket, "-n", "k8s.io", "task", "ls"],
                               capture_output=True, text=True, check=True, timeout=30).stdout
        wanted = container_id.split("://", 1)[-1]
        for line in tasks.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == wanted:
                return int(parts[1])
        raise AssertionError(f"containerd has no task {wanted}:\n{tasks}")


@dataclass
class KindCluster(E2eCluster):
    name: str = "gpuwm-e2e"
    created: bool = False

    @classmethod
    def create(cls, scenario_dir: Path) -> KindCluster:
        """A kind cluster from kind-config.yaml (its worker mounts /tmp/gpuwm-e2e, the scenario folder)."""
        name = os.environ.get("CLUSTER", "gpuwm-e2e")
        listed = subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True, check=True).stdout.split()
        created = name not in listed
        if created:
            subprocess.run(["kind", "create", "cluster", "--name", name, "--config", str(E2E / "kind-config.yaml"),
                            "--wait", "180s"], check=True, timeout=600)
        kubeconfig = Path(tempfile.mkdtemp(prefix="gpuwm-e2e-kind-")) / "kubeconfig"
        kubeconfig.write_text(subprocess.run(["kind", "get", "kubeconfig", "--name", name], capture_output=True,
                                             text=True, check=True).stdout)
        cluster = cls(kubeconfig=kubeconfig, kubectl_path=shutil.which("kubectl") or "kubectl",
                      node_name=f"{name}-worker", scenario_dir=scenario_dir, name=name, created=created)
        cluster.kubectl("patch", "node", cluster.node_name, "--subresource=status", "--type=json",
                        "-p", '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"2"}]')
        return cluster

    def build_images(self) -> None:
        subprocess.run(["docker", "build", "-t", IMAGE, str(ROOT)], check=True, timeout=1800)
        subprocess.run(["docker", "build", "-t", FAKE_IMAGE, "--build-arg", f"BASE={IMAGE}", "-f",
                        str(E2E / "Dockerfile.fakenvml"), str(ROOT / "tests" / "fakenvml")], check=True, timeout=900)
        subprocess.run(["kind", "load", "docker-image", "--name", self.name, IMAGE, FAKE_IMAGE], check=True,
                       timeout=600)

    def chart_values(self) -> dict[str, Any]:
        values = super().chart_values()
        # kind-config.yaml mounts this machine's /tmp/gpuwm-e2e at /var/lib/gpuwm-e2e in the worker
        values["agent"]["extraVolumes"][0]["hostPath"]["path"] = "/var/lib/gpuwm-e2e"
        values["agent"]["perProcessAttribution"] = True  # no device plugin: the pod is found through its cgroup
        return values

    def host_pid(self, container_id: str) -> int:
        wanted = container_id.split("://", 1)[-1]
        found = subprocess.run(["docker", "exec", self.node_name, "crictl", "inspect", "--output", "go-template",
                                "--template", "{{.info.pid}}", wanted], capture_output=True, text=True, check=True)
        return int(found.stdout.strip())

    def stop(self) -> None:
        if self.created and os.environ.get("KEEP_CLUSTER", "0") != "1":
            subprocess.run(["kind", "delete", "cluster", "--name", self.name], capture_output=True, timeout=300)
