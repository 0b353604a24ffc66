"""The pure accounting engine: allocation, utilisation, idle time and energy (DESIGN §3).

Imports nothing from Kubernetes, NVML, HTTP or storage (an import-linter contract). What other
layers use of it is named here: the engine and its settings, the columnar input the agents'
feed is read into (`SampleBatch`), the pieces of a saved state that the controller writes
as it finds them (`LazyEntries`, `RawDoubles`, `RawJson`), and what is decided from the engine's
figures alone: the idle policies' steps (`PolicyEvaluator`) and the cost of GPU time (`CostMeter`).
"""

from gpuwm.accounting.cost import (
    CostMeter,
    PriceBook,
    ProjectCost,
    WorkloadCost,
    energy_cost,
    gpu_seconds_cost,
    price_figures,
    project_costs,
)
from gpuwm.accounting.engine import Engine
from gpuwm.accounting.persist import LazyEntries, StateError, saved_entries
from gpuwm.accounting.policy import (
    Planned,
    Policy,
    PolicyError,
    PolicyEvaluator,
    PolicyOutlook,
    Result,
    Step,
    Subject,
    exempt,
    holds_gpus,
    parse_time,
    selects,
)
from gpuwm.accounting.rawcolumns import RawDoubles, RawJson
from gpuwm.accounting.replay_steps import ReplayInputError, read_policies, read_pricing
from gpuwm.accounting.state import EngineConfig, SampleBatch

__all__ = [
    "CostMeter", "Engine", "EngineConfig", "LazyEntries", "Planned", "Policy", "PolicyError",
    "PolicyEvaluator", "PolicyOutlook", "PriceBook", "ProjectCost", "RawDoubles", "RawJson",
    "ReplayInputError", "Result", "SampleBatch", "StateError", "Step", "Subject", "WorkloadCost",
    "energy_cost", "exempt", "gpu_seconds_cost", "holds_gpus", "parse_time", "price_figures", "project_costs",
    "read_policies", "read_pricing", "saved_entries", "selects",
]
