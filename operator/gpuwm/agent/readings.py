"""What the NVML sampler keeps per device between polls, and what it hands over for each poll.

`Device` is a GPU or MIG instance with its cursors into the driver's buffers and the polls waiting
for the next read (`Pending`); a `Reading` is one device's figures for one poll, `GpuSample` fields
and the raw process list that attribution (`gpuwm.agent.attribution`) gives pods.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


def unopened_uuid(node: str, index: int) -> str:
    """The stand-in UUID of GPU `index` on `node` while NVML cannot open it (its real UUID is unreadable then).

    Stable across polls and agent restarts, unique in the cluster (the controller keys GPUs by UUID),
    never a real NVML UUID (those are `GPU-` and 32 hex digits in 8-4-4-4-12 groups) and free of
    `::` (a time-sliced replica's separator).
    """
    return f"GPU-unopened-{node}-{index}"


@dataclass
class Device:
    """A GPU or MIG instance found by discovery, with its per-poll cursors."""

    handle: Any
    uuid: str
    index: int | None
    model: str | None
    parent_uuid: str | None = None
    parent_handle: Any = None
    mig_profile: str | None = None
    device_units: float = 1.0
    util_cursor_us: int = 0
    process_cursor_us: int = 0
    process_utilization_supported: bool = True
    #: the last reading of the figures read every `GAUGES_EVERY_SECONDS`, by field, and when (monotonic seconds)
    gauges: dict[str, float | None] = field(default_factory=dict)
    gauges_at: float = -math.inf
    #: why NVML could not open this GPU (then `handle` is None and `uuid` is `unopened_uuid`)
    open_error: str | None = None
    #: polls taken since the buffers were last read, waiting for their share of the next read
    pending: list[Pending] = field(default_factory=list)
    #: the time (s) of the last poll whose reading left the sampler, the lower bound of the next poll's interval
    emitted_t: float | None = None
    #: the energy (mJ) handed over with the poll at `emitted_t`: the counter's reading, or carried forward from it
    energy_mj: float | None = None
    #: the energy counter's last reading (mJ) and when it was taken (monotonic seconds)
    energy_counter_mj: float | None = None
    energy_counter_at: float = -math.inf
    #: a change since the last read (holders, processes, health, a new device): the next read settles the counter
    settle: bool = True
    #: what the last poll saw: its pods (from the caller), its processes' PIDs and whether it was healthy
    holders: frozenset[Any] = frozenset()
    pids: frozenset[int] = frozenset()
    healthy: bool | None = None


@dataclass(slots=True)
class Pending:
    """One poll of one device until the buffers are read: its instant figures, or a finished unhealthy reading."""

    t: float
    fields: dict[str, Any]
    #: (PID, used bytes) from the running list; None when the device gave none (or failed)
    running: list[tuple[int, int | None]] | None = None
    #: per-process SM % read at this poll (a shared device); None when not read
    sm_by_pid: dict[int, float] | None = None
    power_mw: float | None = None
    #: the device's SM % from `nvmlDeviceGetUtilizationRates` at this poll: the figure where no sample covers it
    instant_sm_percent: float | None = None
    final: bool = False
    #: the pods holding the device at this poll, as the caller names them
    holders: frozenset[Any] = frozenset()


#: the pods holding a device at a poll, given the PIDs its process list names (the caller's view)
HoldersOf = Callable[["Device", frozenset[int]], frozenset[Any]]


def no_holders(device: Device, pids: frozenset[int]) -> frozenset[Any]:
    return frozenset()


class RawProcess(NamedTuple):
    """A compute process as NVML lists it (attribution adds its pod); a tuple: built in C."""

    pid: int
    memory_used_bytes: float | None
    sm_percent: float | None


@dataclass(slots=True)
class Reading:
    """One device's figures for a poll: `GpuSample` fields (without `processes`) and the raw processes."""

    fields: dict[str, Any]
    processes: list[RawProcess] | None = None

    @property
    def uuid(self) -> str:
        return str(self.fields["uuid"])


@dataclass
class PollResult:
    """The readings of one poll and how long NVML took."""

    samples: list[Reading]
    nvml_seconds: float
    #: the PIDs this poll's process lists name (the readings may be of earlier polls)
    pids: frozenset[int] = frozenset()
    #: whether this poll read the buffers (then `samples` holds every poll since the last read)
    read_buffers: bool = False
