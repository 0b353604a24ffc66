"""Kubernetes API access: the one HTTP client, the login, and the token bucket that paces writes.

Every other room reaches the API server through `KubeClient`; nothing here knows about pods,
workloads or status, so this room imports no other room of the controller.
"""

from gpuwm.controller.kube.client import KubeApiError, KubeClient, resource_path
from gpuwm.controller.kube.login import kube_login
from gpuwm.controller.kube.ratelimit import TokenBucket

__all__ = ["KubeApiError", "KubeClient", "TokenBucket", "kube_login", "resource_path"]
