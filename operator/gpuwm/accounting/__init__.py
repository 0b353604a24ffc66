"""The pure accounting engine: allocation, utilisation, idle time and energy (DESIGN §3).

Imports nothing from Kubernetes, NVML, HTTP or storage (an import-linter contract).
"""

from gpuwm.accounting.engine import Engine
from gpuwm.accounting.persist import StateError
from gpuwm.accounting.state import EngineConfig

__all__ = ["Engine", "EngineConfig", "StateError"]
