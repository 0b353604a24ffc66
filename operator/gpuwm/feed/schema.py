"""The feed's schema: what an answer of `/v1/snapshot` holds (docs/snapshot-feed.md).

Its `devices` entries as a pydantic model, and the field lists of the columnar form
(`format=columns`, what the controller asks for), which `gpuwm.feed.encode` writes and
`gpuwm.feed.decode` reads: one list each, so the two sides cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: `/v1/snapshot?format=`: rows (one JSON object per sample, for people: `curl | jq`, `gpuwm agent --once`)
#: or columns (one array per field: what the controller asks for and reads)
SNAPSHOT_FORMATS = ("rows", "columns")

#: fields constant per device in practice: stored once per `gpus` entry
DEVICE_FIELDS = (
    "uuid", "node", "index", "model", "parent_uuid", "mig_profile", "device_units", "memory_total_bytes",
    "power_limit_watts",
)
#: what a device field left out of a row means (GpuSample's defaults)
_DEVICE_DEFAULTS: dict[str, Any] = {"device_units": 1.0}


def device_key(sample: Mapping[str, Any]) -> tuple[Any, ...]:
    """A sample's `DEVICE_FIELDS` values (their defaults where left out): its `gpus` entry, and what tells a
    device's polls apart when they are merged."""
    return tuple(sample.get(name, _DEVICE_DEFAULTS.get(name)) for name in DEVICE_FIELDS)


#: per-sample numbers, one array each (null where not reported)
NUMBER_COLUMNS = (
    "seq", "sm_percent", "memory_used_bytes", "memory_activity_percent", "power_watts", "energy_joules",
    "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz", "pcie_rx_bytes_per_second", "pcie_tx_bytes_per_second",
    "merged_seconds",
)
#: each process's fields in the flattened `processes` member (with `row`, whose sample it is)
PROCESS_FIELDS = ("pid", "pod_uid", "container", "sm_percent", "memory_used_bytes")

#: `/v1/snapshot?devices_tag=TAG`: the tag of the `gpus` and `devices` the puller holds (see `encode.devices_members`)
DEVICES_TAG_PARAM = "devices_tag"
#: a tag longer than this is not one an agent gave: the puller neither keeps nor sends it
DEVICES_TAG_MAX_LENGTH = 64

#: active: SM at or above the idle threshold; idle-held: a process holds the GPU but SM is below it;
#: allocated-empty: a pod holds it and runs nothing on it; unallocated: nobody holds it;
#: unknown: NVML gave no utilisation (an unhealthy GPU, or one that reports none)
DeviceState = Literal["active", "idle-held", "allocated-empty", "unallocated", "unknown"]


class AgentDevice(BaseModel):
    """One GPU, MIG instance or time-sliced replica on the node and the pod that holds it."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    uuid: str = Field(min_length=1, description="GPU or MIG UUID (a replica's physical GPU).")
    device_id: str = Field(min_length=1, description="The device plugin's ID: the UUID, or `GPU-uuid::N` for a replica.")
    index: int | None = Field(default=None, ge=0)
    model: str | None = None
    parent_uuid: str | None = None
    mig_profile: str | None = None
    units: float = Field(gt=0, le=1, description="GPU units this entry stands for (1, a MIG fraction, 1/replicas).")
    resource_name: str | None = Field(default=None, description="Extended resource, e.g. nvidia.com/gpu.")
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = Field(default=None, description="Known from process cgroups or the kubelet stats summary.")
    container: str | None = None
    attributed_by: Literal["pod-resources", "cgroup"] | None = None
    state: DeviceState
    healthy: bool = True
    error: str | None = None
