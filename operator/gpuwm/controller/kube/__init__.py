"""Kubernetes API access: the one HTTP client, the login, and the token bucket that paces writes.

Every other room reaches the API server through `KubeClient`; nothing here knows about pods,
workloads or status, so this room imports no other room of the controller.
"""

from gpuwm.controller.kube.client import KubeApiError, KubeClient, resource_path
from gpuwm.controller.kube.login import kube_login
from gpuwm.controller.kube.peering import (
    Peering,
    Replica,
    hold_leadership,
    label_own_pod,
    replica_priority,
    this_replica,
    wait_to_lead,
)
from gpuwm.controller.kube.ratelimit import TokenBucket

__all__ = [
    "KubeApiError", "KubeClient", "Peering", "Replica", "TokenBucket", "hold_leadership", "kube_login",
    "label_own_pod", "replica_priority", "resource_path", "this_replica", "wait_to_lead",
]
