"""A Kubernetes API emulator for gpuwm's integration tests (see server.py for what it keeps of the real API)."""

from .resources import ResourceType, minimal_crd
from .runner import EmulatorThread, KubeHttp, grant_admin_reads
from .server import Fault, KubernetesEmulator

__all__ = ["EmulatorThread", "Fault", "KubeHttp", "KubernetesEmulator", "ResourceType", "grant_admin_reads", "minimal_crd"]
