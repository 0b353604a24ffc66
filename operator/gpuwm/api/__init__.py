"""gpuwm api: the HTTP metrics API, the dashboard and `/metrics` over a store (DESIGN §5).

Its face is what the controller and the demo start it with. The names load their modules when first
asked for (PEP 562), so a process that never serves the API (the controller with `--api-listen ''`)
does not import FastAPI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwm.api.app import create_app
    from gpuwm.api.server import ApiServer
    from gpuwm.api.tls import kept_in_secret, self_signed, tls_files

_MODULE_OF = {
    "create_app": "gpuwm.api.app",
    "ApiServer": "gpuwm.api.server",
    "kept_in_secret": "gpuwm.api.tls",
    "self_signed": "gpuwm.api.tls",
    "tls_files": "gpuwm.api.tls",
}

__all__ = ["ApiServer", "create_app", "kept_in_secret", "self_signed", "tls_files"]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuwm.api' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
