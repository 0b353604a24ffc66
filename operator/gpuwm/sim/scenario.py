"""What a simulated run depends on: the fleet's size, the seed, and the faults to inject."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class AgentOutage(BaseModel):
    """Node `node`'s agent is gone over [start, end): no samples from it."""

    model_config = ConfigDict(frozen=True)

    node: str
    start: float
    end: float


class GpuLoss(BaseModel):
    """GPU `gpu_index` of `node` falls off the bus at `at` and stays lost."""

    model_config = ConfigDict(frozen=True)

    node: str
    gpu_index: int = Field(ge=0)
    at: float


class SimConfig(BaseModel):
    """What a simulated run depends on; the same config gives the same run."""

    model_config = ConfigDict(frozen=True)

    seed: int = 1
    nodes: int = Field(default=8, ge=1)
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    interval_seconds: float = Field(default=1.0, gt=0)
    start_time: float = 0.0
    occupancy: float = Field(default=0.75, gt=0, le=1, description="Fraction of GPU units the arrivals aim to keep held.")
    pod_stats_interval_seconds: float = Field(default=15.0, gt=0)
    idle_threshold_percent: float = Field(default=1.0, ge=0, le=100)
    outages: tuple[AgentOutage, ...] = ()
    gpu_losses: tuple[GpuLoss, ...] = ()


def default_faults(nodes: list[str], start: float, duration_seconds: float) -> tuple[tuple[AgentOutage, ...], tuple[GpuLoss, ...]]:
    """One agent outage (a tenth of the run, from its first third) and one lost GPU (half-way)."""
    if len(nodes) < 2:
        return (), ()
    outage_start = start + duration_seconds / 3.0
    outage = AgentOutage(node=nodes[1 % len(nodes)], start=outage_start,
                         end=outage_start + max(60.0, math.floor(duration_seconds / 10.0)))
    loss = GpuLoss(node=nodes[0], gpu_index=0, at=start + duration_seconds / 2.0)
    return (outage,), (loss,)
