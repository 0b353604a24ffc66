"""Per-pod host resources: what the agent reads from the kubelet (stats summary: CPU, memory, network,
ephemeral storage; cAdvisor: disk reads and writes), and what the pod spec asks for (`PodResources`)."""

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
    disk_read_bytes_per_second: float | None = Field(
        default=None, ge=0, description="Block-device reads of the pod's containers (cAdvisor container_fs_reads_bytes_total)."
    )
    disk_write_bytes_per_second: float | None = Field(
        default=None, ge=0, description="Block-device writes of the pod's containers (cAdvisor container_fs_writes_bytes_total)."
    )


class PodResources(BaseModel):
    """A pod's CPU, memory and ephemeral-storage requests and limits, summed over its containers.

    Read from the pod spec by the controller rather than from cAdvisor's spec series: cAdvisor has the
    CPU limit (quota / period) and the memory limit, but no memory or ephemeral-storage request, and its
    CPU shares are the request only after a round trip through cgroup v2's weight. None: no container
    sets it (a limit missing on one container leaves the pod unlimited, so it is None too).
    """

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    cpu_request_cores: float | None = Field(default=None, ge=0)
    cpu_limit_cores: float | None = Field(default=None, ge=0)
    memory_request_bytes: float | None = Field(default=None, ge=0)
    memory_limit_bytes: float | None = Field(default=None, ge=0)
    ephemeral_storage_request_bytes: float | None = Field(default=None, ge=0)
    ephemeral_storage_limit_bytes: float | None = Field(default=None, ge=0)
