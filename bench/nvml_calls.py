"""What each NVML call the agent makes costs on this machine's driver: wall and CPU time per call.

The agent's poll is these calls for every GPU; a call that blocks (as `nvmlDeviceGetPcieThroughput` does, for
its 20 ms count) stretches every poll. Run it on a GPU node, or on the fake library for comparison:

    .venv/bin/python bench/nvml_calls.py [--repeat 50]
    LD_LIBRARY_PATH=DIR FAKE_NVML_SCENARIO=FILE .venv/bin/python bench/nvml_calls.py

Prints a table (median and max per call, for GPU 0) and the agent's own poll time over the same GPUs.
"""

from __future__ import annotations

import argparse
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

from gpuwm.agent.nvml import _VALUE_FIELDS, NvmlSampler, _samples  # noqa: E402


def _calls(handle: Any, cursor_us: int) -> dict[str, Callable[[], Any]]:
    return {
        "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetSamples(GPU utilisation)":
            lambda: pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, cursor_us),
        "nvmlDeviceGetSamples(memory utilisation)":
            lambda: pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_MEMORY_UTILIZATION_SAMPLES, cursor_us),
        "the agent's one-call nvmlDeviceGetSamples(GPU)":
            lambda: _samples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, cursor_us),
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
        "nvmlDeviceGetComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--pcie-copy-seconds", type=float, default=0.0,
                        help="also copy host<->GPU with PyTorch this long each way, printing both PCIe readings")
    options = parser.parse_args()
    if options.pcie_copy_seconds:
        _pcie_during_copies(options.pcie_copy_seconds)
    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    print(f"driver {driver}; {pynvml.nvmlDeviceGetCount()} GPUs; GPU 0: {pynvml.nvmlDeviceGetName(handle)}")
    print(f"{'call':46} {'wall ms p50':>11} {'max':>8} {'CPU ms p50':>10}  outcome")
    cursor_us = int((time.time() - 1.0) * 1e6)
    for name, call in _calls(handle, cursor_us).items():
        walls, cpus, outcome = _time(call, options.repeat if "Throughput" not in name else max(3, options.repeat // 10))
        print(f"{name:46} {1000 * statistics.median(walls):11.3f} {1000 * max(walls):8.3f} "
              f"{1000 * statistics.median(cpus):10.3f}  {outcome}")
    pynvml.nvmlShutdown()

    sampler = NvmlSampler("bench", 1.0)
    sampler.start()
    polls = []
    for _ in range(20):
        time.sleep(0.1)
        polls.append(sampler.poll().nvml_seconds)
    sampler.stop()
    print(f"the agent's poll of {len(sampler.devices)} device(s), 20 at 10 Hz: p50 {1000 * statistics.median(polls):.2f} ms, "
          f"max {1000 * max(polls):.2f} ms (PCIe read on the first, at most every 5 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
