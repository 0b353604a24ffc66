"""kopf imported without the Kubernetes clients it only probes for (one function, called by the controller's entry).

kopf imports the official Kubernetes client, kubernetes_asyncio and pykube at its own import only to
recognise their model objects in `kopf.adopt()`, which gpuwm never passes; loading the official
client costs a large part of the controller's memory budget, for nothing gpuwm uses.
"""

from __future__ import annotations

import sys

#: the clients kopf probes for at import; hidden only while kopf itself is imported
HIDDEN_CLIENTS = ("kubernetes", "kubernetes_asyncio", "pykube")


def import_kopf_without_clients() -> bool:
    """Import kopf with `HIDDEN_CLIENTS` hidden from it; True where this call imported it (False: already imported).

    Each client not yet imported is set to None in `sys.modules` (`import` raises ImportError, which
    kopf takes as "not installed") and removed again once kopf is in, so the client stays importable
    afterwards: the kubeconfig login outside a cluster uses the official one
    (`gpuwm.controller.kube.login`). It must run before anything else imports kopf: `gpuwm controller`
    calls it first (`gpuwm.controller.command.run`).
    """
    if "kopf" in sys.modules:
        return False
    hidden = [name for name in HIDDEN_CLIENTS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import` raises ImportError
    try:
        import kopf  # noqa: F401
    finally:
        for name in hidden:
            del sys.modules[name]
    return True
