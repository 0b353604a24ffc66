"""One GPU sample: the record the agent takes, the controller pulls and `gpuwm replay` reads.

The same model serves the replay trace's `sample` line and the agent's `/v1/snapshot`
records (which add `seq`), so the two can never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeAlias

from pydantic import BaseModel, ConfigDict, Field


class ProcessSample(BaseModel):
    """A compute process on a GPU, attributed to a pod where the agent could tell."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    pid: int = Field(ge=0, description="Host PID of the process.")
    pod_uid: str | None = Field(default=None, description="UID of the pod the process belongs to, if known.")
    container: str | None = Field(default=None, description="Container name inside the pod, if known.")
    sm_percent: float | None = Field(
        default=None, ge=0, le=100, description="SM utilisation of this process on the device, percent of the device."
    )
    memory_used_bytes: float | None = Field(default=None, ge=0, description="Device memory held by the process.")


class GpuSample(BaseModel):
    """GPU `uuid` on `node` at time `t`, describing the interval since its previous sample.

    Optional figures are `None` where the driver does not report them; a sample with
    `sm_percent` of `None` (a lost GPU, an NVML error) makes its interval unmonitored.
    NaN and ±Infinity are refused in every number: one NaN turns every sum it enters
    (GPU-seconds, energy, a project's utilisation) into NaN, and JSON cannot carry it on.
    """

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    t: float = Field(description="Sample time, seconds (any origin; epoch seconds in the agent).")
    node: str = Field(min_length=1, description="Node name.")
    uuid: str = Field(min_length=1, description="GPU or MIG instance UUID (a time-sliced replica uses the GPU's UUID).")
    seq: int | None = Field(default=None, ge=0, description="Agent's sequence number (snapshot feed only).")
    index: int | None = Field(default=None, ge=0, description="NVML device index.")
    model: str | None = Field(default=None, description="GPU product name.")
    parent_uuid: str | None = Field(default=None, description="Parent GPU UUID for a MIG instance.")
    mig_profile: str | None = Field(default=None, description="MIG profile such as 1g.10gb.")
    device_units: float = Field(
        default=1.0, gt=0, le=1, description="Size of this device in GPU units: 1 for a whole GPU, the slice fraction for MIG."
    )
    healthy: bool = Field(default=True, description="False when NVML reported an error for this device.")
    error: str | None = Field(default=None, description="The NVML error for an unhealthy device.")
    sm_percent: float | None = Field(default=None, ge=0, le=100, description="Device SM utilisation over the interval.")
    memory_used_bytes: float | None = Field(default=None, ge=0, description="Device memory used.")
    memory_total_bytes: float | None = Field(default=None, ge=0, description="Device memory total.")
    memory_activity_percent: float | None = Field(
        default=None, ge=0, le=100, description="Memory controller busy percent (NVML memory utilisation)."
    )
    power_watts: float | None = Field(default=None, ge=0, description="Power draw.")
    power_limit_watts: float | None = Field(default=None, ge=0, description="Enforced power limit.")
    energy_joules: float | None = Field(
        default=None, ge=0, description="The GPU's cumulative energy counter (a MIG instance carries its parent's)."
    )
    temperature_celsius: float | None = Field(default=None, description="GPU temperature.")
    sm_clock_mhz: float | None = Field(default=None, ge=0, description="SM clock.")
    memory_clock_mhz: float | None = Field(default=None, ge=0, description="Memory clock.")
    pcie_rx_bytes_per_second: float | None = Field(default=None, ge=0, description="PCIe receive throughput.")
    pcie_tx_bytes_per_second: float | None = Field(default=None, ge=0, description="PCIe transmit throughput.")
    processes: list[ProcessSample] | None = Field(
        default=None, description="Compute processes with per-process utilisation; absent when the driver gives none."
    )
    merged_seconds: float | None = Field(
        default=None, ge=0,
        description="Set on a sample that stands for a run of the agent's polls (gpuwm.feed.merge): its last time "
        "minus its first. The figures are the run's time-weighted means; only the gap before the run's first poll, "
        "t - merged_seconds - the previous sample's t, can make its interval unmonitored.",
    )

    @property
    def memory_percent(self) -> float | None:
        """Memory used as a percent of total, or None when either is unknown."""
        return _memory_percent(self.memory_used_bytes, self.memory_total_bytes)


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """A device's latest sample as the controller keeps it: GpuSample's fields, in its order, not validated again.

    Built from the pulled columns, which the feed validated column by column, for every device each cycle and
    kept until the next: a plain record costs a fraction of a pydantic model's construction and memory.
    """

    t: float
    node: str
    uuid: str
    seq: int | None
    index: int | None
    model: str | None
    parent_uuid: str | None
    mig_profile: str | None
    device_units: float
    healthy: bool
    error: str | None
    sm_percent: float | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    memory_activity_percent: float | None
    power_watts: float | None
    power_limit_watts: float | None
    energy_joules: float | None
    temperature_celsius: float | None
    sm_clock_mhz: float | None
    memory_clock_mhz: float | None
    pcie_rx_bytes_per_second: float | None
    pcie_tx_bytes_per_second: float | None
    processes: list[ProcessSample] | None
    merged_seconds: float | None

    @classmethod
    def of(cls, sample: LatestSample) -> DeviceReading:
        """The same figures as a reading."""
        return cls(**{field.name: getattr(sample, field.name) for field in fields(cls)})

    @property
    def memory_percent(self) -> float | None:
        """Memory used as a percent of total, or None when either is unknown."""
        return _memory_percent(self.memory_used_bytes, self.memory_total_bytes)


#: a device's latest sample as the engine and the store read it: validated (one sample at a time, a restored
#: state) or read from the pulled columns
LatestSample: TypeAlias = GpuSample | DeviceReading


def _memory_percent(used_bytes: float | None, total_bytes: float | None) -> float | None:
    if used_bytes is None or not total_bytes:
        return None
    return min(100.0, 100.0 * used_bytes / total_bytes)
