"""NVML sampler: one reading per GPU and MIG instance per poll, through the real pynvml binding.

A reading holds exactly the fields of `GpuSample` as plain values; the agent validates it once, after
attribution has filled in the processes' pods, so a poll builds each model only once.

Each poll makes the driver's instant calls that definitions rest on (memory, power, utilisation rates,
the process list: microseconds each); temperature, clocks, the power limit and PCIe are read every
`GAUGES_EVERY_SECONDS`. The buffered and cumulative figures (`nvmlDeviceGetSamples` for SM activity, the
energy counter) cost milliseconds of CPU a call on a real driver, and need not be read every poll: the
driver keeps timestamped utilisation samples, and the energy counter only grows. So the samples are read
at most every `buffer_read_seconds` (and at once when a device's holders, processes or health change, on
a new device, or when the caller asks), and split into the polls held since by their own timestamps
(`interval_means`): a poll's reading leaves the sampler up to `buffer_read_seconds` late, still covering
exactly its own interval. An interval no utilisation sample covers falls back to that poll's
`nvmlDeviceGetUtilizationRates`. The energy counter: see `ENERGY_COUNTER_EVERY_SECONDS`.

Memory activity (`memory_activity_percent`, the memory controller's busy time) is that instant call's
figure: no definition rests on it (DESIGN §3's memory utilisation is memory used over total), and its
own sample buffer costs the driver as much CPU to read as the SM one.

Per-process utilisation is read only where it decides something (DESIGN §3): on a device held
by more than one pod, every poll (the driver answers one figure per process since the cursor,
which cannot be split afterwards), and, once per read, on a busy device whose process list is
empty (a process in another PID namespace: the call names its host PID). A sole holder takes
the device's figures, so its processes carry no SM figure (`sm_percent` None: no per-process data).

A call a device does not support leaves its field `None`; any other NVML error marks that device
unhealthy for this poll and the others go on. A GPU that cannot even be opened (GPU_IS_LOST at
start) stays listed by its index under `unopened_uuid`, unhealthy with the error, and is tried
again with backoff until it opens.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import pynvml

from gpuwm.agent.polls import carry_energy, interval_means, spread_energy
from gpuwm.agent.readings import (
    Device,
    HoldersOf,
    Pending,
    PollResult,
    RawProcess,
    Reading,
    no_holders,
    unopened_uuid,
)

log = logging.getLogger(__name__)


#: errors that mean "this device does not report that figure", not "this device is failing"
_UNSUPPORTED = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_InvalidArgument,
    pynvml.NVMLLibraryMismatchError,
)
#: errors that leave a figure unreported: the above, or NVML finding nothing to report
_ABSENT = (*_UNSUPPORTED, pynvml.NVMLError_NotFound)
#: GPU instance slices of a whole GPU when NVML does not say (A100, H100, H200, B200)
DEFAULT_MIG_SLICES = 7
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
#: The figures no definition rests on, each a glimpse of its moment: temperature, the clocks, the enforced power
#: limit and PCIe throughput. They are read at most this often and repeated in between: fresh once per scrape of the
#: chart's PodMonitor (15 s; dcgm-exporter collects every 30 s by default). `nvmlDeviceGetPcieThroughput` counts
#: bytes for 20 ms before it returns, one direction a call, and costs the driver's CPU besides; the others are cheap
#: in a loop but not always at 1 Hz. (NVML's PCIe byte-count fields would give a
#: whole-interval rate, but on an H200 with driver 580 they are 32-bit and wrap many times a second at full speed.)
GAUGES_EVERY_SECONDS = 15.0
#: The energy counter costs the driver as much CPU as a utilisation buffer read, at times several times that,
#: yet it only grows: so a whole GPU's counter is read at most this often, when its
#: holders, processes or health change, and on `--once`; the polls in between carry it forward by their power
#: readings (the driver's 1 s average on Ampere and later; `carry_energy`), and the next reading sets them right
#: (`spread_energy`). A GPU cut into MIG instances reads it with every buffer read (its instances have no power
#: reading of their own).
ENERGY_COUNTER_EVERY_SECONDS = 60.0


def _running_processes(handle: Any) -> list[tuple[int, int | None]]:
    """(PID, used bytes or None) of each compute process on the device."""
    return [(process.pid, process.usedGpuMemory) for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine: no driver, or the library is missing."""


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _optional(call: Any, *args: Any) -> Any:
    """The call's result, or None when the device does not report that figure."""
    try:
        return call(*args)
    except _ABSENT:
        return None


def _percent(value: float | None) -> float | None:
    return None if value is None else max(0.0, min(100.0, value))


def mig_profile_name(slices: int, memory_mib: float) -> str:
    """`1g.10gb`-style name from the instance's slices and memory (NVML rounds memory up to GB)."""
    return f"{slices}g.{math.ceil(memory_mib / 1024 - 0.05)}gb"


class NvmlSampler:
    """Reads every GPU on the node; discovery is redone every `rediscover_seconds` or on a count change."""

    def __init__(self, node: str, interval_seconds: float, rediscover_seconds: float = 30.0,
                 buffer_read_seconds: float = 5.0) -> None:
        self.node = node
        self.interval_seconds = interval_seconds
        self.rediscover_seconds = rediscover_seconds
        self.buffer_read_seconds = buffer_read_seconds
        self._buffers_read_at = -math.inf
        self._device_set: frozenset[str] = frozenset()
        self.devices: list[Device] = []
        self._discovered_at = -math.inf
        self._count: int | None = None
        self._started = False
        #: when to try unopened GPUs again (monotonic seconds), and the wait after that try
        self._reopen_at = math.inf
        self._reopen_wait_seconds = interval_seconds

    def start(self) -> str:
        """Initialise NVML; raises NvmlUnavailable with the reason when there is no usable driver."""
        try:
            pynvml.nvmlInit()
            version = _optional(pynvml.nvmlSystemGetDriverVersion)
        except pynvml.NVMLError_LibraryNotFound as error:
            raise NvmlUnavailable(
                "NVIDIA driver not found: libnvidia-ml.so.1 could not be loaded "
                f"({error}); run the agent on a GPU node with the NVIDIA driver and container toolkit"
            ) from None
        except pynvml.NVMLError as error:
            raise NvmlUnavailable(f"NVML could not be initialised: {error}; check the NVIDIA driver on this node") from None
        self._started = True
        self.discover()
        return "unknown" if version is None else _text(version)

    def stop(self) -> None:
        if self._started:
            self._started = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as error:
                log.debug("nvmlShutdown failed: %s", error)

    def discover(self) -> None:
        """Enumerate GPUs and MIG instances, keeping the cursors of devices already known."""
        known = {device.uuid: device for device in self.devices}
        count = pynvml.nvmlDeviceGetCount()
        found: list[Device] = []
        start_us = int((time.time() - self.interval_seconds) * 1e6)
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError as error:
                found.extend(self._unopened(index, error, known))
                continue
            model = self._model(handle, uuid)
            gpu = known.get(uuid) or Device(
                handle, uuid, index, model, util_cursor_us=start_us, process_cursor_us=start_us
            )
            gpu.handle, gpu.index, gpu.model = handle, index, model or gpu.model
            found.append(gpu)
            try:
                found.extend(self._mig_instances(gpu, known, start_us))
            except pynvml.NVMLError as error:  # a failing GPU is still listed; poll() reports it unhealthy
                log.warning("GPU %s: MIG layout unreadable: %s", uuid, error)
        added = {d.uuid for d in found} - set(known)
        removed = set(known) - {d.uuid for d in found}
        if added or removed:
            log.info("GPU devices changed", extra={"added": sorted(added), "removed": sorted(removed)})
        self.devices = found
        self._count = count
        self._discovered_at = time.monotonic()
        if any(device.handle is None for device in found):
            self._reopen_at = self._discovered_at + self._reopen_wait_seconds
            self._reopen_wait_seconds = min(self.rediscover_seconds, 2 * self._reopen_wait_seconds)
        else:
            self._reopen_at, self._reopen_wait_seconds = math.inf, self.interval_seconds

    def _unopened(self, index: int, error: pynvml.NVMLError, known: dict[str, Device]) -> list[Device]:
        """GPU `index` that NVML cannot open now: as it was if it was open before (its reads then fail and say
        so under its real UUID), else a stand-in under `unopened_uuid` that polls report unhealthy."""
        before = [d for d in known.values() if d.index == index and d.handle is not None]
        if before:
            return before  # the GPU and its MIG instances
        reason = f"GPU {index} could not be opened: {type(error).__name__}: {error}"
        uuid = unopened_uuid(self.node, index)
        if uuid not in known:
            log.warning("%s; listed as unhealthy and tried again", reason, extra={"gpu_index": index})
        return [Device(None, uuid, index, None, open_error=reason)]

    def _model(self, handle: Any, uuid: str) -> str | None:
        try:
            return _text(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as error:
            log.warning("GPU %s name unreadable: %s", uuid, error)
            return None

    def _mig_instances(self, gpu: Device, known: dict[str, Device], start_us: int) -> list[Device]:
        mode = _optional(pynvml.nvmlDeviceGetMigMode, gpu.handle)
        if not mode or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        try:
            maximum = pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)
        except pynvml.NVMLError as error:
            log.warning("GPU %s: MIG instances unreadable: %s", gpu.uuid, error)
            return []
        parent_attributes = _optional(pynvml.nvmlDeviceGetAttributes_v2, gpu.handle)
        total_slices = getattr(parent_attributes, "gpuInstanceSliceCount", 0) or DEFAULT_MIG_SLICES
        instances: list[Device] = []
        for mig_index in range(maximum):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, mig_index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError_NotFound:
                continue
            except pynvml.NVMLError as error:
                log.warning("GPU %s MIG slot %d unreadable: %s", gpu.uuid, mig_index, error)
                continue
            attributes = _optional(pynvml.nvmlDeviceGetAttributes_v2, handle)
            slices = int(getattr(attributes, "gpuInstanceSliceCount", 0) or 0)
            memory_mib = float(getattr(attributes, "memorySizeMB", 0) or 0)
            profile = mig_profile_name(slices, memory_mib) if slices and memory_mib else None
            units = min(1.0, slices / total_slices) if slices else 1.0 / total_slices
            device = known.get(uuid) or Device(
                handle, uuid, gpu.index, gpu.model,
                util_cursor_us=start_us, process_cursor_us=start_us,
            )
            device.handle, device.index, device.model = handle, gpu.index, gpu.model
            device.parent_uuid, device.parent_handle = gpu.uuid, gpu.handle
            device.mig_profile, device.device_units = profile, units
            instances.append(device)
        return instances

    def poll(self, holders: HoldersOf = no_holders, read_buffers: bool = False) -> PollResult:
        """Take this poll's instant figures of every device, and the readings of every poll since the last read.

        `holders`: the pods holding a device as the caller knows them, given the PIDs NVML lists on it: a
        device with more than one gets its per-process utilisation every poll, and a change reads the buffers
        at once (so the polls before it are attributed while the caller's view of them still holds).
        `read_buffers`: read them now (`--once`). Never raises for a failing device.
        """
        started = time.perf_counter()
        monotonic = time.monotonic()
        due = read_buffers or monotonic - self._buffers_read_at + self.interval_seconds / 2 >= self.buffer_read_seconds
        # the device count is checked with each read (a call that costs more at 1 Hz than in a loop), so a GPU
        # that comes or goes is found within `buffer_read_seconds`, and in any case every `rediscover_seconds`
        if (monotonic - self._discovered_at >= self.rediscover_seconds or monotonic >= self._reopen_at
                or (due and self._count_changed())):
            self.discover()
        now = time.time()
        device_set = frozenset(device.uuid for device in self.devices)
        due = due or device_set != self._device_set
        self._device_set = device_set
        pids: set[int] = set()
        for device in self.devices:
            pending = self._instant(device, now, holders)
            device.pending.append(pending)
            device_pids = frozenset(pid for pid, _ in pending.running or ())
            pids.update(device_pids)
            healthy = not pending.final
            # a new device, new holders, processes come or go, health changes: the polls so far leave now, and
            # the energy counter is read, so what each holder used is settled by the counter itself
            changed = (read_buffers or device.emitted_t is None or device.healthy != healthy
                       or device.pids != device_pids or device.holders != pending.holders)
            device.settle = device.settle or changed
            due = due or changed
            device.healthy, device.pids, device.holders = healthy, device_pids, pending.holders
        samples: list[Reading] = []
        if due:
            self._buffers_read_at = monotonic
            # a GPU's counter read once a read: its MIG instances carry the same reading (NVML has none per instance)
            energy_by_chip: dict[int, float | None] = {}
            mig_parents = {device.parent_uuid for device in self.devices if device.parent_uuid is not None}
            for device in self.devices:
                counter_due = (device.settle or device.parent_uuid is not None or device.uuid in mig_parents
                               or monotonic - device.energy_counter_at >= ENERGY_COUNTER_EVERY_SECONDS)
                samples.extend(self._read_buffers(device, energy_by_chip if counter_due else None))
            # in time order, each poll's devices together in device order (the caller attributes a poll as one)
            samples.sort(key=lambda reading: float(reading.fields["t"]))
        return PollResult(samples, time.perf_counter() - started, frozenset(pids), due)

    def _count_changed(self) -> bool:
        try:
            return bool(pynvml.nvmlDeviceGetCount() != self._count)
        except pynvml.NVMLError:
            return False

    def _identity(self, device: Device, now: float) -> dict[str, Any]:
        return {
            "t": now, "node": self.node, "uuid": device.uuid, "index": device.index, "model": device.model,
            "parent_uuid": device.parent_uuid, "mig_profile": device.mig_profile, "device_units": device.device_units,
        }

    def _unhealthy(self, device: Device, now: float, error: str) -> Reading:
        return Reading({**self._identity(device, now), "healthy": False, "error": error})

    def _instant(self, device: Device, now: float, holders: HoldersOf) -> Pending:
        """This poll's instant figures of `device`, or its unhealthy reading (`final`)."""
        message = device.open_error
        if message is None:
            try:
                return self._read(device, now, holders)
            except pynvml.NVMLError as error:
                message = f"{type(error).__name__}: {error}"
            except Exception as error:  # a binding surprise on one GPU must not stop the others
                message = f"{type(error).__name__}: {error}"
                log.exception("GPU %s: unexpected error while sampling", device.uuid)
        return Pending(now, self._unhealthy(device, now, message).fields, final=True)

    def _read(self, device: Device, now: float, holders_of: HoldersOf) -> Pending:
        handle = device.handle
        memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
        rates = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
        # power is not additive over MIG instances: it stays on the parent GPU's sample
        power_mw = _optional(pynvml.nvmlDeviceGetPowerUsage, handle) if device.parent_handle is None else None
        fields = {
            **self._identity(device, now),
            "healthy": True,
            "sm_percent": None,
            "memory_used_bytes": None if memory is None else float(memory.used),
            "memory_total_bytes": None if memory is None else float(memory.total),
            "memory_activity_percent": None if rates is None else _percent(float(rates.memory)),
            "power_watts": None if power_mw is None else power_mw / 1000.0,
            "energy_joules": None,
            **self._gauges(device),
        }
        running = _optional(_running_processes, handle)
        holders = holders_of(device, frozenset(pid for pid, _ in running or ()))
        previous_t = device.pending[-1].t if device.pending else device.emitted_t
        # a shared device's processes split its activity: read each poll, as the driver gives one figure per
        # process since the cursor (not a series that a later read could split)
        sm_by_pid = (self._process_utilization(device, previous_t)
                     if len(holders) > 1 and running is not None and device.process_utilization_supported else None)
        instant_sm = None if rates is None else float(rates.gpu)
        return Pending(now, fields, running, sm_by_pid, power_mw, instant_sm, holders=holders)

    def _read_buffers(self, device: Device, energy_by_chip: dict[int, float | None] | None) -> list[Reading]:
        """Every poll of `device` since the last read, finished with the buffers' figures split among them.

        `energy_by_chip`: the counter readings of this read, by chip; None: the counter is not read this time.
        """
        pending, device.pending = device.pending, []
        if not pending:
            return []
        if energy_by_chip is not None:
            device.settle = False
        healthy = [poll for poll in pending if not poll.final]
        if healthy:
            try:
                finished = self._finish(device, healthy, energy_by_chip)
            except pynvml.NVMLError as error:  # the device failed between its instant calls and this read
                message = f"{type(error).__name__}: {error}"
                finished = [self._unhealthy(device, poll.t, message) for poll in healthy]
            by_time = {poll.t: reading for poll, reading in zip(healthy, finished, strict=True)}
        else:
            by_time = {}
        device.emitted_t = pending[-1].t
        return [Reading(poll.fields) if poll.final else by_time[poll.t] for poll in pending]

    def _finish(self, device: Device, polls: list[Pending],
                energy_by_chip: dict[int, float | None] | None) -> list[Reading]:
        """`polls`' readings: SM activity split by the samples' timestamps, the energy counter's growth spread by
        power (or, between the counter's readings, carried forward by it)."""
        start_t = device.emitted_t if device.emitted_t is not None else device.util_cursor_us / 1e6
        times = [start_t, *(poll.t for poll in polls)]
        bounds_us = [int(t * 1e6) for t in times]
        sm = self._split(device, bounds_us)
        if None in sm:  # intervals no sample covers: the poll's instant rate
            sm = [poll.instant_sm_percent if value is None else value for poll, value in zip(polls, sm, strict=True)]
        powers = [poll.power_mw for poll in polls]
        if energy_by_chip is None:
            energies = carry_energy(device.energy_mj, times, powers)
        else:
            chip = device.parent_handle if device.parent_handle is not None else device.handle
            if id(chip) not in energy_by_chip:  # by identity: a pynvml handle cannot be a dict key
                energy_by_chip[id(chip)] = _optional(pynvml.nvmlDeviceGetTotalEnergyConsumption, chip)
            energy_mj = energy_by_chip[id(chip)]
            energies = spread_energy(device.energy_mj, energy_mj, times, powers, device.energy_counter_mj)
            device.energy_counter_mj, device.energy_counter_at = energy_mj, time.monotonic()
        device.energy_mj = energies[-1]
        # a busy device whose process list is empty: the processes run in another PID namespace, and
        # per-process utilisation still names their host PIDs (one figure each over these polls)
        hidden: dict[int, float] | None = None
        if device.process_utilization_supported and any(
                poll.running == [] and poll.sm_by_pid is None and (value or 0.0) > 0 for poll, value in zip(polls, sm, strict=True)):
            hidden = self._process_utilization(device, start_t)
        readings = []
        for poll, sm_percent, energy in zip(polls, sm, energies, strict=True):
            fields = poll.fields
            fields["sm_percent"] = _percent(sm_percent)
            fields["energy_joules"] = None if energy is None else energy / 1000.0
            sm_by_pid = poll.sm_by_pid
            if sm_by_pid is None and hidden is not None and poll.running == [] and (sm_percent or 0.0) > 0:
                sm_by_pid = hidden
            readings.append(Reading(fields, self._processes(device, poll.running, sm_by_pid, fields["sm_percent"])))
        return readings

    def _gauges(self, device: Device) -> dict[str, float | None]:
        """Temperature, clocks, power limit and PCIe (receive, transmit bytes/s) as `GpuSample` fields: read at most
        every `GAUGES_EVERY_SECONDS`, kept in between. A MIG instance's temperature is its GPU's; the other figures
        are the GPU's own (its sample carries them), so an instance has none."""
        now = time.monotonic()
        if now - device.gauges_at < GAUGES_EVERY_SECONDS:
            return device.gauges
        handle, parent = device.handle, device.parent_handle
        temperature = _optional(pynvml.nvmlDeviceGetTemperature, handle if parent is None else parent,
                                pynvml.NVML_TEMPERATURE_GPU)
        limit_mw = sm_clock = memory_clock = rx_kbs = tx_kbs = None
        if parent is None:
            limit_mw = _optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            sm_clock = _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            memory_clock = _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)
            rx_kbs = _optional(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            tx_kbs = _optional(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        device.gauges_at = now
        device.gauges = {
            "temperature_celsius": None if temperature is None else float(temperature),
            "power_limit_watts": None if limit_mw is None else limit_mw / 1000.0,
            "sm_clock_mhz": None if sm_clock is None else float(sm_clock),
            "memory_clock_mhz": None if memory_clock is None else float(memory_clock),
            "pcie_rx_bytes_per_second": None if rx_kbs is None else rx_kbs * 1024.0,
            "pcie_tx_bytes_per_second": None if tx_kbs is None else tx_kbs * 1024.0,
        }
        return device.gauges

    def _split(self, device: Device, bounds_us: list[int]) -> list[float | None]:
        """The SM samples since the cursor, as a mean per interval of `bounds_us` (see `interval_means`)."""
        last_seen = max(device.util_cursor_us, bounds_us[0])
        try:
            value_type, samples = pynvml.nvmlDeviceGetSamples(device.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                              last_seen)
        except _ABSENT:
            return [None] * (len(bounds_us) - 1)
        name = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
        end = bounds_us[-1]
        stamped = []
        newest = last_seen
        for sample in samples:
            stamp = sample.timeStamp
            if last_seen < stamp:
                stamped.append((stamp, float(getattr(sample.sampleValue, name))))
                if newest < stamp <= end:
                    newest = stamp
        device.util_cursor_us = newest  # samples after the last poll stay for the next read
        return interval_means(stamped, bounds_us)

    def _processes(self, device: Device, running: list[tuple[int, int | None]] | None,
                   sm_by_pid: dict[int, float] | None, device_sm_percent: float | None) -> list[RawProcess] | None:
        """The compute processes NVML lists, and those its per-process utilisation names besides.

        A process of another PID namespace (the agent's own, without hostPID) is missing from the
        running list, yet `nvmlDeviceGetProcessUtilization` still gives its host PID and SM %: it is
        added without a memory figure, and the host's /proc (`proc_root`) finds its pod.
        `sm_by_pid` None: per-process utilisation was not read (a sole holder's device): no SM figures.
        """
        if running is None:
            return None
        if sm_by_pid is None:
            if not running and not device_sm_percent:
                return []  # idle and no process: that says "no processes", as a read would
            return [RawProcess(pid, None if used is None else float(used), None) for pid, used in running]
        # no per-process sample while the device itself was busy: the driver gave none, it is not 0 %
        missing = not sm_by_pid and bool(device_sm_percent)
        # supported, and a process without a sample ran no kernels since the last poll
        absent = 0.0 if device.process_utilization_supported and not missing else None
        processes = [RawProcess(pid, None if used is None else float(used),
                                _percent(sm_by_pid.get(pid, absent))) for pid, used in running]
        listed = {pid for pid, _ in running}
        processes += [RawProcess(pid, None, _percent(sm)) for pid, sm in sm_by_pid.items() if pid not in listed]
        return processes

    def _process_utilization(self, device: Device, since_t: float | None) -> dict[int, float]:
        """Mean SM % per PID since `since_t` (or the cursor) ({} when none ran; unsupported devices are remembered)."""
        if not device.process_utilization_supported:
            return {}
        cursor = device.process_cursor_us if since_t is None else max(device.process_cursor_us, int(since_t * 1e6))
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(device.handle, cursor)
        except pynvml.NVMLError_NotFound:
            return {}
        except _UNSUPPORTED:
            device.process_utilization_supported = False
            return {}
        totals: dict[int, tuple[float, int]] = {}
        newest = cursor
        for sample in samples:
            stamp = sample.timeStamp
            if stamp > cursor:
                pid = sample.pid
                total, count = totals.get(pid, (0.0, 0))
                totals[pid] = (total + sample.smUtil, count + 1)
                if stamp > newest:
                    newest = stamp
        device.process_cursor_us = newest
        return {pid: total / count for pid, (total, count) in totals.items()}
