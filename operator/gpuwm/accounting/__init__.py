"""The pure accounting engine: allocation, utilisation, idle time and energy (DESIGN §3).

Imports nothing from Kubernetes, NVML, HTTP or storage (an import-linter contract). What other
layers use of it is named here: the engine and its settings, the columnar input the agents'
feed is read into (`SampleBatch`), and the pieces of a saved state that the controller writes
as it finds them (`LazyEntries`, `RawDoubles`, `RawJson`).
"""

from gpuwm.accounting.engine import Engine
from gpuwm.accounting.persist import LazyEntries, StateError, saved_entries
from gpuwm.accounting.rawcolumns import RawDoubles, RawJson, doubles_from_saved
from gpuwm.accounting.state import EngineConfig, SampleBatch

__all__ = ["Engine", "EngineConfig", "LazyEntries", "RawDoubles", "RawJson", "SampleBatch", "StateError",
           "doubles_from_saved", "saved_entries"]
