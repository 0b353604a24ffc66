"""gpuwm controller.

kopf is imported here first, with the official Kubernetes client (and pykube) hidden from it:
kopf imports them at its own import only to recognise their model objects in `kopf.adopt()`,
which gpuwm never passes, and the official client's import is ~11 MiB of resident memory.
The client stays importable afterwards (the kubeconfig login outside a cluster uses it).
"""

import sys

if "kopf" not in sys.modules:
    _hidden = [name for name in ("kubernetes", "kubernetes_asyncio", "pykube") if name not in sys.modules]
    for _name in _hidden:
        sys.modules[_name] = None  # type: ignore[assignment]  # `import` raises ImportError
    try:
        import kopf  # noqa: F401
    finally:
        for _name in _hidden:
            del sys.modules[_name]
