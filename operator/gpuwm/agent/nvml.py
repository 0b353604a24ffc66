"""NVML sampler: one reading per GPU and MIG instance per poll, through the real pynvml binding.

A reading holds exactly the fields of `GpuSample` as plain values; the agent validates it once,
after attribution has filled in the processes' pods, so a poll builds each model only once.

Utilisation comes from `nvmlDeviceGetSamples` since the previous poll, so a sample covers the
whole interval rather than an instant; an empty buffer falls back to `nvmlDeviceGetUtilizationRates`.
A call a device does not support leaves its field `None`; any other NVML error marks that device
unhealthy for this poll and the others go on. A GPU that cannot even be opened (GPU_IS_LOST at
start) stays listed by its index under `unopened_uuid`, unhealthy with the error, and is tried
again with backoff until it opens.
"""

from __future__ import annotations

import ctypes
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import pynvml

log = logging.getLogger(__name__)

T = TypeVar("T")

#: errors that mean "this device does not report that figure", not "this device is failing"
_UNSUPPORTED = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_InvalidArgument,
    pynvml.NVMLLibraryMismatchError,
)
_MIB = 1024 * 1024
#: GPU instance slices of a whole GPU when NVML does not say (A100, H100, H200, B200)
DEFAULT_MIG_SLICES = 7
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
#: pynvml's structs override `__getattribute__` in Python (to decode byte strings), which makes every
#: field read a Python call; numeric fields need none of that, so the hot loops read them directly
_field = object.__getattribute__
#: NVML's "not available" value for a process's used memory (WDDM on Windows)
_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
#: `nvmlDeviceGetPcieThroughput` counts bytes for 20 ms before it returns, one direction a call: read at every
#: poll it would take 40 ms a GPU (0.32 s of each second on an 8-GPU node at 1 Hz) for a figure that covers 2 % of
#: the interval. So it is read at most this often, its figures kept in between: a 20 ms glimpse of the link either
#: way, and Prometheus scrapes every 10-30 s. (NVML's PCIe byte-count fields would give a whole-interval rate, but
#: on an H200 with driver 580 they are 32-bit and wrap every ~70 ms at the link's 60 GB/s: no use at 1 Hz.)
PCIE_THROUGHPUT_EVERY_SECONDS = 5.0


def _running_processes(handle: Any) -> list[tuple[int, int | None]]:
    """(PID, used bytes or None) of each compute process: `nvmlDeviceGetComputeRunningProcesses`
    without pynvml's per-process friendly objects (each a dozen Python calls; 32 a poll)."""
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    result = function(handle, ctypes.byref(count), None)
    if result == pynvml.NVML_SUCCESS:
        return []
    if result != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
        raise pynvml.NVMLError(result)
    count.value = count.value * 2 + 5  # room for processes started between the two calls
    infos = (pynvml.c_nvmlProcessInfo_v3_t * count.value)()
    result = function(handle, ctypes.byref(count), infos)
    if result != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(result)
    found = []
    for index in range(count.value):
        info = infos[index]
        used = _field(info, "usedGpuMemory")
        found.append((_field(info, "pid"), None if used == _NOT_AVAILABLE else used))
    return found


#: room for the utilisation samples since the last poll in one `nvmlDeviceGetSamples` call (~6 a second)
_SAMPLE_BUFFER = 64


def _samples(handle: Any, sampling_type: int, last_seen_us: int) -> tuple[int, Any]:
    """(value type, samples) newer than `last_seen_us`: `nvmlDeviceGetSamples` in one call into a buffer of
    `_SAMPLE_BUFFER`, where pynvml makes two (the first to size the buffer): 2.5 against 2.8 ms of CPU on an
    H200 (driver 580), twice a GPU a poll. More samples than the buffer holds (after a pause): pynvml's two."""
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
    value_type = ctypes.c_uint(0)
    count = ctypes.c_uint(_SAMPLE_BUFFER)
    buffer = (pynvml.c_nvmlSample_t * _SAMPLE_BUFFER)()
    result = function(handle, ctypes.c_uint(sampling_type), ctypes.c_ulonglong(last_seen_us), ctypes.byref(value_type),
                      ctypes.byref(count), buffer)
    if result == pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
        return pynvml.nvmlDeviceGetSamples(handle, sampling_type, last_seen_us)  # type: ignore[no-any-return]
    if result != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(result)
    return value_type.value, buffer[: min(count.value, _SAMPLE_BUFFER)]


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine: no driver, or the library is missing."""


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
    memory_util_cursor_us: int = 0
    process_cursor_us: int = 0
    process_utilization_supported: bool = True
    #: every per-poll figure read without an "unsupported" error so far (one try block per poll)
    all_supported: bool = True
    #: the last PCIe throughput reading (receive, transmit bytes/s) and when it was taken (monotonic seconds)
    pcie_throughput: tuple[float | None, float | None] = (None, None)
    pcie_throughput_at: float = -math.inf
    #: why NVML could not open this GPU (then `handle` is None and `uuid` is `unopened_uuid`)
    open_error: str | None = None


class RawProcess(NamedTuple):
    """A compute process as NVML lists it (attribution adds its pod); a tuple: built in C, 32 a poll."""

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
    errors: dict[str, str] = field(default_factory=dict)


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _optional(call: Any, *args: Any) -> Any:
    """The call's result, or None when the device does not report that figure."""
    try:
        return call(*args)
    except _UNSUPPORTED:
        return None
    except pynvml.NVMLError_NotFound:
        return None


def _percent(value: float | None) -> float | None:
    return None if value is None else max(0.0, min(100.0, value))


def mig_profile_name(slices: int, memory_mib: float) -> str:
    """`1g.10gb`-style name from the instance's slices and memory (NVML rounds memory up to GB)."""
    return f"{slices}g.{math.ceil(memory_mib / 1024 - 0.05)}gb"


class NvmlSampler:
    """Reads every GPU on the node; discovery is redone every `rediscover_seconds` or on a count change."""

    def __init__(self, node: str, interval_seconds: float, rediscover_seconds: float = 30.0) -> None:
        self.node = node
        self.interval_seconds = interval_seconds
        self.rediscover_seconds = rediscover_seconds
        self.devices: list[Device] = []
        self.driver_version: str | None = None
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
            self.driver_version = "unknown" if version is None else _text(version)
        except pynvml.NVMLError_LibraryNotFound as error:
            raise NvmlUnavailable(
                "NVIDIA driver not found: libnvidia-ml.so.1 could not be loaded "
                f"({error}); run the agent on a GPU node with the NVIDIA driver and container toolkit"
            ) from None
        except pynvml.NVMLError as error:
            raise NvmlUnavailable(f"NVML could not be initialised: {error}; check the NVIDIA driver on this node") from None
        self._started = True
        self.discover()
        return self.driver_version

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
                handle, uuid, index, model, util_cursor_us=start_us, memory_util_cursor_us=start_us, process_cursor_us=start_us
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
                util_cursor_us=start_us, memory_util_cursor_us=start_us, process_cursor_us=start_us,
            )
            device.handle, device.index, device.model = handle, gpu.index, gpu.model
            device.parent_uuid, device.parent_handle = gpu.uuid, gpu.handle
            device.mig_profile, device.device_units = profile, units
            instances.append(device)
        return instances

    def poll(self) -> PollResult:
        """One sample per device; never raises for a failing device."""
        started = time.perf_counter()
        monotonic = time.monotonic()
        if (monotonic - self._discovered_at >= self.rediscover_seconds or monotonic >= self._reopen_at
                or self._count_changed()):
            self.discover()
        samples: list[Reading] = []
        errors: dict[str, str] = {}
        now = time.time()
        for device in self.devices:
            if device.open_error is not None:
                errors[device.uuid] = device.open_error
                samples.append(self._unhealthy(device, now, device.open_error))
                continue
            try:
                samples.append(self._read(device, now))
            except pynvml.NVMLError as error:
                errors[device.uuid] = f"{type(error).__name__}: {error}"
                samples.append(self._unhealthy(device, now, errors[device.uuid]))
            except Exception as error:  # a binding surprise on one GPU must not stop the others
                errors[device.uuid] = f"{type(error).__name__}: {error}"
                log.exception("GPU %s: unexpected error while sampling", device.uuid)
                samples.append(self._unhealthy(device, now, errors[device.uuid]))
        return PollResult(samples, time.perf_counter() - started, errors)

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

    def _read(self, device: Device, now: float) -> Reading:
        handle = device.handle
        sm_percent, memory_activity_percent = self._utilization(device)
        if device.all_supported and device.parent_handle is None:
            try:  # the usual case, one try for all the figures: a whole GPU that reports them all
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                energy_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
                temperature = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
                power_mw = pynvml.nvmlDeviceGetPowerUsage(handle)
                limit_mw = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)
                sm_clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
                memory_clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            except (*_UNSUPPORTED, pynvml.NVMLError_NotFound):
                device.all_supported = False  # from now on each figure on its own, as below
        if not device.all_supported or device.parent_handle is not None:
            memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
            # the chip-wide figures of a MIG instance are its parent's (NVML has none per instance)
            chip = device.parent_handle if device.parent_handle is not None else handle
            energy_mj = _optional(pynvml.nvmlDeviceGetTotalEnergyConsumption, chip)
            temperature = _optional(pynvml.nvmlDeviceGetTemperature, chip, pynvml.NVML_TEMPERATURE_GPU)
            if device.parent_handle is None:
                power_mw = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
                limit_mw = _optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
                sm_clock = _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
                memory_clock = _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)
            else:  # power is not additive over instances: it stays on the parent GPU's sample
                power_mw = limit_mw = sm_clock = memory_clock = None
        # PCIe is the link's: a MIG instance has none of its own (its parent's sample carries it)
        rx_bytes_per_second, tx_bytes_per_second = (None, None) if device.parent_handle is not None else self._pcie(device)
        fields = {
            "t": now, "node": self.node, "uuid": device.uuid, "index": device.index, "model": device.model,
            "parent_uuid": device.parent_uuid, "mig_profile": device.mig_profile, "device_units": device.device_units,
            "healthy": True,
            "sm_percent": sm_percent,
            "memory_used_bytes": None if memory is None else float(_field(memory, "used")),
            "memory_total_bytes": None if memory is None else float(_field(memory, "total")),
            "memory_activity_percent": memory_activity_percent,
            "power_watts": None if power_mw is None else power_mw / 1000.0,
            "power_limit_watts": None if limit_mw is None else limit_mw / 1000.0,
            "energy_joules": None if energy_mj is None else energy_mj / 1000.0,
            "temperature_celsius": None if temperature is None else float(temperature),
            "sm_clock_mhz": None if sm_clock is None else float(sm_clock),
            "memory_clock_mhz": None if memory_clock is None else float(memory_clock),
            "pcie_rx_bytes_per_second": rx_bytes_per_second,
            "pcie_tx_bytes_per_second": tx_bytes_per_second,
        }
        return Reading(fields, self._processes(device, sm_percent))

    def _pcie(self, device: Device) -> tuple[float | None, float | None]:
        """(receive, transmit) bytes/s: the 20 ms reading, taken at most every `PCIE_THROUGHPUT_EVERY_SECONDS`."""
        now = time.monotonic()
        if now - device.pcie_throughput_at >= PCIE_THROUGHPUT_EVERY_SECONDS:
            device.pcie_throughput_at = now
            rx_kbs = _optional(pynvml.nvmlDeviceGetPcieThroughput, device.handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            tx_kbs = _optional(pynvml.nvmlDeviceGetPcieThroughput, device.handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            device.pcie_throughput = (None if rx_kbs is None else rx_kbs * 1024.0,
                                      None if tx_kbs is None else tx_kbs * 1024.0)
        return device.pcie_throughput

    def _utilization(self, device: Device) -> tuple[float | None, float | None]:
        """(SM %, memory activity %) over the samples since the last poll, else the instant rates."""
        sm = self._samples_mean(device, pynvml.NVML_GPU_UTILIZATION_SAMPLES, "util_cursor_us")
        memory = self._samples_mean(device, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES, "memory_util_cursor_us")
        if sm is None or memory is None:
            rates = _optional(pynvml.nvmlDeviceGetUtilizationRates, device.handle)
            if rates is not None:
                sm = float(rates.gpu) if sm is None else sm
                memory = float(rates.memory) if memory is None else memory
        return _percent(sm), _percent(memory)

    def _samples_mean(self, device: Device, sampling_type: int, cursor: str) -> float | None:
        last_seen = int(getattr(device, cursor))
        try:
            value_type, samples = _samples(device.handle, sampling_type, last_seen)
        except (*_UNSUPPORTED, pynvml.NVMLError_NotFound):
            return None
        # one pass, reading the struct fields through the plain descriptor (see _field)
        name = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
        total, count, newest = 0.0, 0, last_seen
        for sample in samples:
            stamp = _field(sample, "timeStamp")
            if stamp > last_seen:
                total += getattr(_field(sample, "sampleValue"), name)
                count += 1
                if stamp > newest:
                    newest = stamp
        if not count:
            return None
        setattr(device, cursor, newest)
        return total / count

    def _processes(self, device: Device, device_sm_percent: float | None) -> list[RawProcess] | None:
        """The compute processes NVML lists, and those its per-process utilisation names besides.

        A process of another PID namespace (the agent's own, without hostPID) is missing from the
        running list, yet `nvmlDeviceGetProcessUtilization` still gives its host PID and SM %: it is
        added without a memory figure, and the host's /proc (`proc_root`) finds its pod. On a busy
        device with an empty list that call is made for exactly this.
        """
        running = _optional(_running_processes, device.handle)
        if running is None:
            return None
        sm_by_pid = self._process_utilization(device) if running or device_sm_percent else {}
        # no per-process sample while the device itself was busy: the driver gave none, it is not 0 %
        missing = not sm_by_pid and bool(device_sm_percent)
        processes = []
        fill_zero = device.process_utilization_supported and not missing
        for pid, used in running:
            sm = sm_by_pid.get(pid)
            if sm is None:
                sm = 0.0 if fill_zero else None  # supported, but the process ran no kernels since the last poll
            elif sm > 100.0:
                sm = 100.0
            elif sm < 0.0:
                sm = 0.0
            processes.append(RawProcess(pid, None if used is None else float(used), sm))
        listed = {pid for pid, _ in running}
        for pid, sm in sm_by_pid.items():
            if pid not in listed:
                processes.append(RawProcess(pid, None, min(100.0, max(0.0, sm))))
        return processes

    def _process_utilization(self, device: Device) -> dict[int, float]:
        """Mean SM % per PID since the last poll ({} when none ran; unsupported devices are remembered)."""
        if not device.process_utilization_supported:
            return {}
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(device.handle, device.process_cursor_us)
        except pynvml.NVMLError_NotFound:
            return {}
        except _UNSUPPORTED:
            device.process_utilization_supported = False
            return {}
        totals: dict[int, tuple[float, int]] = {}
        cursor = newest = device.process_cursor_us
        for sample in samples:
            stamp = _field(sample, "timeStamp")
            if stamp > cursor:
                pid = _field(sample, "pid")
                total, count = totals.get(pid, (0.0, 0))
                totals[pid] = (total + _field(sample, "smUtil"), count + 1)
                if stamp > newest:
                    newest = stamp
        device.process_cursor_us = newest
        return {pid: total / count for pid, (total, count) in totals.items()}
