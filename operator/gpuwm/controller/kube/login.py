"""Kubernetes credentials for the controller: the service account in a pod, else the kubeconfig.

In a pod the service account is read here, as `kubernetes.config.load_incluster_config` reads it (the
API server at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the mounted token and CA), so the
controller never imports the official client in the cluster, resident memory it has no use for. The
token is read again at every login: a bound token the kubelet rotates is picked up on a 401.

Outside a cluster the official client reads the kubeconfig (every auth form it knows: exec
plugins, OIDC, client certificates, tokens), as `kopf run` does; without that client, kopf's own
kubeconfig reader.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import kopf

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class InClusterError(kopf.LoginError):
    """In a pod whose service account cannot be used: names the file or variable at fault."""


def in_cluster_login(
    trust_env: bool = False, environ: Mapping[str, str] | None = None, directory: Path | None = None
) -> kopf.ConnectionInfo | None:
    """The pod's service account credentials; None outside a pod (no $KUBERNETES_SERVICE_HOST or no token)."""
    environ = os.environ if environ is None else environ
    directory = SERVICE_ACCOUNT_DIR if directory is None else directory
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    token_path = directory / "token"
    if not host or not token_path.exists():
        return None
    if not port.isdigit():
        raise InClusterError(f"KUBERNETES_SERVICE_PORT={port!r} is not a port number")
    try:
        token = token_path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise InClusterError(f"cannot read the service account token {token_path}: {error}") from None
    if not token:
        raise InClusterError(f"the service account token {token_path} is empty")
    namespace_path, ca_path = directory / "namespace", directory / "ca.crt"
    namespace = namespace_path.read_text(encoding="utf-8").strip() if namespace_path.exists() else ""
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    return kopf.ConnectionInfo(
        server=f"https://{host}:{port}",
        ca_path=str(ca_path) if ca_path.exists() else None,
        token=token,
        default_namespace=namespace or None,
        trust_env=trust_env,
    )


def kube_login(settings: kopf.OperatorSettings, logger: kopf.Logger) -> kopf.ConnectionInfo | None:
    """The service account in a pod, else the kubeconfig (module docstring); None when neither is there."""
    info = in_cluster_login(trust_env=settings.networking.trust_env)
    if info is not None:
        logger.debug("logged in with the pod's service account")
        return info
    return (kopf.login_via_client(logger=logger, settings=settings)  # None when the official client is missing
            or kopf.login_with_kubeconfig(settings=settings))
