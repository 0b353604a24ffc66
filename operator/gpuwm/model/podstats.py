"""Per-pod host resources from the kubelet stats summary (CPU, memory, network, ephemeral storage)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PodStatsSample(BaseModel):
    """One pod's host resource use at time `t`, as the agent reads it from the kubelet."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)  # NaN or infinity: refused

    t: float = Field(description="Sample time, epoch seconds.")
    node: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    pod: str = Field(min_length=1)
    pod_uid: str = Field(min_length=1)
    seq: int | None = Field(default=None, ge=0, description="Agent's sequence number (snapshot feed only).")
    cpu_usage_cores: float | None = Field(default=None, ge=0)
    memory_used_bytes: float | None = Field(default=None, ge=0, description="Working set bytes.")
    network_rx_bytes_per_second: float | None = Field(default=None, ge=0)
    network_tx_bytes_per_second: float | None = Field(default=None, ge=0)
    ephemeral_storage_used_bytes: float | None = Field(default=None, ge=0)
