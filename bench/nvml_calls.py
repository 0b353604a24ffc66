"""What each NVML call the agent makes costs on this machine's driver: wall and CPU time per call.

The agent's poll is these calls for every GPU; a call that blocks (as `nvmlDeviceGetPcieThroughput` does, for
its 20 ms count) stretches every poll. Run it on a GPU node, or on the fake library for comparison:

    .venv/bin/python bench/nvml_calls.py [--repeat 50]
    LD_LIBRARY_PATH=DIR FAKE_NVML_SCENARIO=FILE .venv/bin/python bench/nvml_calls.py

Prints a table (median and max per call, for GPU 0), the agent's own poll time over the same GPUs, how many
seconds each of the driver's sample buffers holds (samples per second x buffer length; the agent's
`nvmlBufferReadSeconds` should stay under half of it), what `nvmlDeviceGetSamples` costs by how far back it
reads, what per-process utilisation returns while a process computes (with PyTorch), the driver's share of the
agent's CPU at its schedule, and the real agent's CPU per GPU-second at 1 Hz (a `gpuwm agent` process, with the
default buffer read, against the agent's 1.5 ms target, and with every poll reading).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

import pynvml  # noqa: E402

from gpuwm.agent.nvml import (  # noqa: E402
    _VALUE_FIELDS,
    ENERGY_COUNTER_EVERY_SECONDS,
    GAUGES_EVERY_SECONDS,
    NvmlSampler,
    _running_processes,
)

#: the agent's target on a real driver; the calls the agent makes every poll of a whole GPU, and those
#: it makes every `GAUGES_EVERY_SECONDS` (PCIe's besides)
TARGET_MS_PER_GPU_SECOND = 1.5
INSTANT_CALLS = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
                 "the agent's nvmlDeviceGetComputeRunningProcesses")
GAUGE_CALLS = ("nvmlDeviceGetTemperature", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetClockInfo(SM)",
               "nvmlDeviceGetClockInfo(memory)")


def _calls(handle: Any, cursor_us: int) -> dict[str, Callable[[], Any]]:
    return {
        "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetSamples(GPU utilisation)":
            lambda: pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, cursor_us),
        "nvmlDeviceGetSamples(memory utilisation)":
            lambda: pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES, cursor_us),
        "the agent's one-call nvmlDeviceGetSamples(GPU)":
            lambda: pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, cursor_us),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
        "nvmlDeviceGetTemperature": lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle),
        "nvmlDeviceGetClockInfo(SM)": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "nvmlDeviceGetClockInfo(memory)": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        "nvmlDeviceGetFieldValues(PCIe RX, TX bytes)": lambda: pynvml.nvmlDeviceGetFieldValues(
            handle, [pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]),
        "nvmlDeviceGetFieldValues(energy)":
            lambda: pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]),
        "nvmlDeviceGetPcieThroughput(RX)":
            lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES),
        "the agent's nvmlDeviceGetComputeRunningProcesses": lambda: _running_processes(handle),
        "nvmlDeviceGetProcessUtilization": lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, cursor_us),
        "nvmlDeviceGetMigMode": lambda: pynvml.nvmlDeviceGetMigMode(handle),
        "nvmlDeviceGetCount": pynvml.nvmlDeviceGetCount,
    }


def _time(call: Callable[[], Any], repeat: int) -> tuple[list[float], list[float], str]:
    walls, cpus, outcome = [], [], "ok"
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            call()
        except pynvml.NVMLError as error:
            outcome = f"{type(error).__name__}"
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return walls, cpus, outcome


#: copies 1 GiB host -> GPU 0 for argv[1] seconds, then GPU 0 -> host as long; prints each phase's span and bytes
COPIER = """
import sys, time
import torch
host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
device = torch.empty_like(host, device="cuda")
device.copy_(host)
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(1.0)
for name, target, source in (("host->gpu", device, host), ("gpu->host", host, device)):
    copies, started = 0, time.time()
    while time.time() - started < float(sys.argv[1]):
        target.copy_(source, non_blocking=True)
        torch.cuda.synchronize()
        copies += 1
    print(name, started, time.time(), copies * host.numel(), flush=True)
    time.sleep(1.0)
"""


def _number(field: Any) -> int:
    """A field value's number through the union member its `valueType` names (these counters: 1, a 32-bit one)."""
    return int(getattr(field.value, _VALUE_FIELDS[field.valueType]))


def _pcie_during_copies(seconds: float) -> None:
    """Both PCIe readings every ~0.25 s while torch copies one way then the other. The byte-count fields are
    32-bit on an H200 with driver 580: at 60 GB/s they wrap every ~70 ms (negative and wrong rates here)."""
    import subprocess

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    fields = [pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]

    def counts() -> tuple[float, float, int, int] | None:
        """(RX, TX, timestamp µs, latency µs) of the byte-count fields; None where the driver has none."""
        try:
            values = pynvml.nvmlDeviceGetFieldValues(handle, fields)
        except pynvml.NVMLError:
            return None
        if values[0].nvmlReturn or values[1].nvmlReturn:
            return None
        return _number(values[0]), _number(values[1]), values[0].timestamp, values[0].latencyUsec

    copier = subprocess.Popen([sys.executable, "-c", COPIER, str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert copier.stdout is not None
        assert copier.stdout.readline().strip() == "ready"
        print(f"{'t':>6} {'counter RX B/s':>15} {'counter TX B/s':>15} {'throughput RX B/s':>18} "
              f"{'throughput TX B/s':>18} {'latency us':>10}")
        started, previous = time.time(), counts()
        if previous is None:
            print("(no PCIe byte-count fields on this driver: the throughput reading alone)")
        while copier.poll() is None:
            now = counts()
            rx = pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES) * 1024.0
            tx = pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES) * 1024.0
            counter_rx = counter_tx = math.nan
            latency = 0
            if now is not None and previous is not None and now[2] > previous[2]:
                span = (now[2] - previous[2]) / 1e6
                counter_rx, counter_tx, latency = (now[0] - previous[0]) / span, (now[1] - previous[1]) / span, now[3]
                previous = now
            print(f"{time.time() - started:6.2f} {counter_rx:15.4g} {counter_tx:15.4g} {rx:18.4g} {tx:18.4g} {latency:10d}")
            time.sleep(0.2)
        print(copier.stdout.read())
    finally:
        if copier.poll() is None:
            copier.kill()
            copier.wait()
        pynvml.nvmlShutdown()


#: computes on GPU 0 (bf16 matrix products) for argv[1] seconds, printing "busy" once it started
LOADER = """
import sys, time
import torch
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
b = torch.randn_like(a)
torch.cuda.synchronize()
print("busy", flush=True)
started = time.time()
while time.time() - started < float(sys.argv[1]):
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
"""


def _full_buffer(handle: Any, sampling_type: int) -> list[int]:
    """The timestamps of every sample the driver holds (pynvml's two calls; a sample in between fails: again)."""
    for _ in range(5):
        try:
            _, samples = pynvml.nvmlDeviceGetSamples(handle, sampling_type, 0)
            return sorted(int(sample.timeStamp) for sample in samples)
        except pynvml.NVMLError_InsufficientSize:
            continue
        except pynvml.NVMLError as error:
            print(f"  samples of type {sampling_type}: {type(error).__name__}")
            return []
    return []


def _buffers(handle: Any) -> None:
    """How many samples each buffer holds, over how many seconds, and what a read costs by how far back it goes."""
    for name, kind in (("GPU utilisation", pynvml.NVML_GPU_UTILIZATION_SAMPLES),
                       ("memory utilisation", pynvml.NVML_MEMORY_UTILIZATION_SAMPLES)):
        stamps = _full_buffer(handle, kind)
        if len(stamps) > 1:
            span = (stamps[-1] - stamps[0]) / 1e6
            gaps = sorted(later - earlier for earlier, later in itertools.pairwise(stamps))
            print(f"{name} samples: the buffer holds {len(stamps)} over {span:.2f} s "
                  f"({(len(stamps) - 1) / span:.2f} a second; median gap {gaps[len(gaps) // 2] / 1000:.1f} ms; "
                  f"newest {time.time() - stamps[-1] / 1e6:.2f} s old)")
    for back in (1.0, 5.0, 10.0, 0.0):
        cursor = int((time.time() - back) * 1e6) if back else 0
        cpus = []
        for _ in range(10):
            cpu = time.thread_time()
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, cursor)
            cpus.append(time.thread_time() - cpu)
        label = f"the last {back:.0f} s" if back else "the whole buffer"
        print(f"the agent's nvmlDeviceGetSamples(GPU) reading {label}: CPU p50 {1000 * statistics.median(cpus):.3f} ms")


def _process_samples(handle: Any, seconds: float) -> None:
    """What nvmlDeviceGetProcessUtilization returns while a process computes: entries per PID and their stamps."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("torch") is None:
        print("(no PyTorch here: per-process utilisation under load not measured)")
        return
    loader = subprocess.Popen([sys.executable, "-c", LOADER, str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert loader.stdout is not None
        if loader.stdout.readline().strip() != "busy":
            print("(the loader did not start)")
            return
        time.sleep(min(seconds / 2, 8.0))
        for back in (0.0, 5.0, 1.0):
            cursor = int((time.time() - back) * 1e6) if back else 0
            try:
                entries = pynvml.nvmlDeviceGetProcessUtilization(handle, cursor)
            except pynvml.NVMLError as error:
                print(f"per-process utilisation since {back or 'the start'}: {type(error).__name__}")
                continue
            by_pid: dict[int, list[tuple[int, int]]] = {}
            for entry in entries:
                by_pid.setdefault(int(entry.pid), []).append((int(entry.timeStamp), int(entry.smUtil)))
            for pid, found in by_pid.items():
                stamps = sorted(stamp for stamp, _ in found)
                print(f"per-process utilisation since {f'{back:.0f} s ago' if back else 'the buffer start (0)'}: "
                      f"PID {pid}{' (the loader)' if pid == loader.pid else ''}: {len(found)} entries over "
                      f"{(stamps[-1] - stamps[0]) / 1e6:.2f} s, SM % {[sm for _, sm in found][:8]}")
        print(f"the loader's device SM % over the same time: {_samples_mean(handle, 5.0)}")
    finally:
        loader.kill()
        loader.wait()


def _cold_calls(handle: Any, seconds: float, buffer_read_seconds: float = 5.0) -> None:
    """The agent's calls for one whole GPU (the table's), once a second, each timed by the CPU it takes.

    The table above calls each one 50 times in a row, where the driver may answer from what it read a moment
    before; at 1 Hz it may not. The buffered ones every `buffer_read_seconds`, reading that far back.
    """
    every_second = ("nvmlDeviceGetCount", *INSTANT_CALLS, *GAUGE_CALLS)
    buffered = ("the agent's one-call nvmlDeviceGetSamples(GPU)", "nvmlDeviceGetTotalEnergyConsumption")
    alternative = "nvmlDeviceGetFieldValues(energy)"  # timed beside the agent's energy call, not the agent's
    cpus: dict[str, list[float]] = {name: [] for name in (*every_second, *buffered, alternative)}
    rounds = max(1, int(seconds))
    started = time.monotonic()
    for round_index in range(rounds):
        calls = _calls(handle, int((time.time() - buffer_read_seconds) * 1e6))
        due: tuple[str, ...] = every_second
        if round_index % max(1, round(buffer_read_seconds)) == 0:
            due = (*every_second, *buffered, alternative)
        for name in due:
            cpu = time.thread_time()
            with contextlib.suppress(pynvml.NVMLError):
                calls[name]()
            cpus[name].append(time.thread_time() - cpu)
        time.sleep(max(0.0, started + round_index + 1 - time.monotonic()))
    print(f"the agent's calls once a second for {rounds} s (buffered ones every {buffer_read_seconds:g} s), CPU ms:")
    per_second = 0.0
    for name, found in cpus.items():
        if found:
            share = sum(found) / rounds
            per_second += 0.0 if name == alternative else share
            aside = "  (not the agent's call)" if name == alternative else ""
            print(f"  {name:52} p50 {1000 * statistics.median(found):7.3f}  max {1000 * max(found):7.3f}  "
                  f"per second {1000 * share:6.3f}{aside}")
    print(f"  all of the agent's: {1000 * per_second:.3f} ms CPU per GPU-second")


def _samples_mean(handle: Any, back: float) -> float | None:
    value_type, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, int((time.time() - back) * 1e6))
    values = [getattr(sample.sampleValue, _VALUE_FIELDS[value_type]) for sample in samples]
    return sum(values) / len(values) if values else None


#: `--profile`: the agent's poll loop in a process of its own under cProfile timed by the poll thread's CPU, from
#: its sixth poll on (the imports and first reads left out); argv: the stats file, the seconds
PROFILED_AGENT = """
import cProfile, sys, threading, time
from gpuwm.agent.core import Agent
from gpuwm.config import Settings
path, seconds = sys.argv[1], float(sys.argv[2])
agent = Agent(Settings(pod_resources_socket="/nonexistent.sock", interval=1.0, log_level="error"), "bench")
agent.start_nvml()
for _ in range(5):
    agent.poll_once()
    time.sleep(1.0)
stop = threading.Event()
threading.Timer(seconds, stop.set).start()
profile = cProfile.Profile(time.thread_time)
profile.enable()
agent.run(stop)
profile.disable()
profile.dump_stats(path)
agent.stop()
"""


def _agent_profile(seconds: float, path: Path) -> None:
    """The agent's poll loop at 1 Hz under cProfile; prints the functions that took the most of its CPU."""
    import os
    import pstats
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT / "operator"), os.environ.get("PYTHONPATH"))))}
    subprocess.run([sys.executable, "-c", PROFILED_AGENT, str(path), str(seconds)], env=env, check=True)
    print(f"the agent's poll loop at 1 Hz under cProfile for {seconds:g} s (CPU), by own time ({path}):")
    pstats.Stats(str(path)).sort_stats("tottime").print_stats(30)


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each of the process's threads, by thread name (schedstat)."""
    found: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            name = (task / "comm").read_text().strip()
            found[name] = found.get(name, 0.0) + int((task / "schedstat").read_text().split()[0]) / 1e9
    return found


def _agent_cpu(seconds: float, buffer_read_seconds: str, gpus: int, load: bool = False) -> float:
    """A real `gpuwm agent` at 1 Hz: its CPU per GPU-second after a 5 s start, by thread, and RSS; `load`: while
    a PyTorch process computes on GPU 0 (the loader's own CPU is not counted)."""
    import os
    import socket
    import subprocess

    loader = None
    if load:
        loader = subprocess.Popen([sys.executable, "-c", LOADER, str(seconds + 15.0)], stdout=subprocess.PIPE, text=True)
        assert loader.stdout is not None
        if loader.stdout.readline().strip() != "busy":
            print("(the loader did not start: the agent not measured under load)")
            return math.nan

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT / "operator"), os.environ.get("PYTHONPATH"))))}
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpuwm.cli", "agent", "--listen", f"127.0.0.1:{port}", "--interval", "1s",
         "--node-name", "bench", "--pod-resources-socket", "/nonexistent.sock", "--log-level", "error",
         "--nvml-buffer-read-seconds", buffer_read_seconds], env=env)
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        """Its threads' time on a CPU (schedstat) where the kernel keeps it, else /proc's ticks."""
        threads = _thread_cpu(agent.pid)
        if threads:
            return sum(threads.values())
        fields = Path(f"/proc/{agent.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    try:
        time.sleep(5.0)
        threads_before, before, started = _thread_cpu(agent.pid), cpu(), time.monotonic()
        time.sleep(seconds)
        used, wall = cpu() - before, time.monotonic() - started
        threads = {name: 1000 * (spent - threads_before.get(name, 0.0)) / wall
                   for name, spent in _thread_cpu(agent.pid).items()}
        rss = next(int(line.split()[1]) / 1024 for line in Path(f"/proc/{agent.pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    finally:
        agent.terminate()
        agent.wait(timeout=15)
        if loader is not None:
            loader.kill()
            loader.wait()
    per_gpu_second_ms = 1000 * used / (wall * gpus)
    print(f"the agent at 1 Hz{' under load' if load else ''}, nvmlBufferReadSeconds={buffer_read_seconds}: "
          f"{per_gpu_second_ms:.2f} ms CPU "
          f"per GPU-second ({used:.2f} CPU-s in {wall:.1f} s, {gpus} GPU(s)), RSS {rss:.1f} MiB"
          "; by thread, ms a second: "
          + ", ".join(f"{name} {share:.2f}" for name, share in sorted(threads.items(), key=lambda item: -item[1])))
    return per_gpu_second_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--pcie-copy-seconds", type=float, default=0.0,
                        help="also copy host<->GPU with PyTorch this long each way, printing both PCIe readings")
    parser.add_argument("--load-seconds", type=float, default=12.0,
                        help="how long a PyTorch process computes while per-process utilisation is read (0: not)")
    parser.add_argument("--agent-seconds", type=float, default=30.0,
                        help="how long each real agent run is measured for its CPU per GPU-second (0: not)")
    parser.add_argument("--no-every-poll", action="store_true",
                        help="leave out the agent run that reads the buffers every poll (the schedule before the buffers were read every few seconds)")
    parser.add_argument("--cold-seconds", type=float, default=12.0,
                        help="how long the agent's calls are made once a second, each timed (0: not)")
    parser.add_argument("--agent-buffer-reads", default="5s",
                        help="the agent's nvmlBufferReadSeconds for each measured run, comma-separated")
    parser.add_argument("--agent-under-load", action="store_true",
                        help="also measure the agent while a PyTorch process computes on GPU 0")
    parser.add_argument("--profile", type=Path, default=None,
                        help="also run the agent under cProfile (its poll thread's CPU), saving the stats here")
    options = parser.parse_args()
    if options.pcie_copy_seconds:
        _pcie_during_copies(options.pcie_copy_seconds)
    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    print(f"driver {driver}; {pynvml.nvmlDeviceGetCount()} GPUs; GPU 0: {pynvml.nvmlDeviceGetName(handle)}")
    print(f"{'call':52} {'wall ms p50':>11} {'max':>8} {'CPU ms p50':>10}  outcome")
    cursor_us = int((time.time() - 1.0) * 1e6)
    cpu_ms: dict[str, float] = {}
    for name, call in _calls(handle, cursor_us).items():
        walls, cpus, outcome = _time(call, options.repeat if "Throughput" not in name else max(3, options.repeat // 10))
        cpu_ms[name] = 1000 * statistics.median(cpus)
        print(f"{name:52} {1000 * statistics.median(walls):11.3f} {1000 * max(walls):8.3f} "
              f"{cpu_ms[name]:10.3f}  {outcome}")
    pynvml.nvmlShutdown()

    sampler = NvmlSampler("bench", 1.0)
    sampler.start()
    polls = []
    for _ in range(20):
        time.sleep(0.1)
        polls.append(sampler.poll().nvml_seconds)
    sampler.stop()
    print(f"the agent's poll of {len(sampler.devices)} device(s), 20 at 10 Hz: p50 {1000 * statistics.median(polls):.2f} ms, "
          f"max {1000 * max(polls):.2f} ms (PCIe read on the first, at most every {GAUGES_EVERY_SECONDS:g} s; "
          f"buffers read every 5 s)")

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        gpus = pynvml.nvmlDeviceGetCount()
        _buffers(handle)
        if options.cold_seconds:
            _cold_calls(handle, options.cold_seconds)
        if options.load_seconds:
            _process_samples(handle, options.load_seconds)
    finally:
        pynvml.nvmlShutdown()
    # the driver's share of the agent's CPU at its schedule (a whole GPU, one pod: no per-process utilisation)
    driver_ms = (sum(cpu_ms[name] for name in INSTANT_CALLS)
                 + (cpu_ms["the agent's one-call nvmlDeviceGetSamples(GPU)"] + cpu_ms["nvmlDeviceGetCount"]) / 5.0
                 + cpu_ms["nvmlDeviceGetTotalEnergyConsumption"] / ENERGY_COUNTER_EVERY_SECONDS
                 + (2 * cpu_ms["nvmlDeviceGetPcieThroughput(RX)"] + sum(cpu_ms[name] for name in GAUGE_CALLS))
                 / GAUGES_EVERY_SECONDS)
    print(f"the driver's calls at the agent's schedule (memory, power, utilisation rates and processes every second, "
          f"SM samples every 5 s, energy every {ENERGY_COUNTER_EVERY_SECONDS:g} s, temperature, clocks, power limit "
          f"and PCIe every {GAUGES_EVERY_SECONDS:g} s), from the table's figures: {driver_ms:.2f} ms CPU per GPU-second")
    if options.agent_seconds:
        for period in options.agent_buffer_reads.split(","):
            agent_ms = _agent_cpu(options.agent_seconds, period, gpus)
            print(f"the target, the agent <= {TARGET_MS_PER_GPU_SECOND} ms CPU per GPU-second "
                  f"(nvmlBufferReadSeconds={period}): {'met' if agent_ms <= TARGET_MS_PER_GPU_SECOND else 'NOT met'} "
                  f"({agent_ms:.2f}; the driver's calls {driver_ms:.2f} at 5 s, the agent's own work and the calls' "
                  f"1 Hz extra {agent_ms - driver_ms:.2f}, shared by {gpus} GPU(s))")
        if options.agent_under_load:
            _agent_cpu(options.agent_seconds, "5s", gpus, load=True)
        if not options.no_every_poll:
            _agent_cpu(options.agent_seconds, "0", gpus)
        if options.profile:
            _agent_profile(options.agent_seconds, options.profile.resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
