"""CPU of one agent `/metrics` render: timeit over the real `MetricsRenderer` on a filled agent state.

    .venv/bin/python bench/agent_scrape.py [--runs 3] [--module PATH]

Two node shapes: 8 whole GPUs with one pod each, and 8 GPUs split into 7 MIG instances each (56 pods);
every per-GPU and per-pod figure filled. Each is timed with and without the process figures; a run is the
best of 5 x N renders under `time.process_time`, and the median of `--runs` runs is printed. `--module`
times another copy of `gpuwm/agent/metrics.py` (e.g. an earlier commit's, from `git show REV:PATH`) for a
before/after on the same machine. Asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwm.agent.core import Agent, DeviceCounters  # noqa: E402
from gpuwm.config import Settings  # noqa: E402
from gpuwm.feed import AgentDevice  # noqa: E402
from gpuwm.model import GpuSample, PodStatsSample  # noqa: E402

NOW = 1_700_000_100.0
GPUS = 8
MIG_INSTANCES = 7


def filled_agent(mig: bool) -> Agent:
    agent = Agent(Settings(pod_resources_socket="/nonexistent/pod-resources.sock", proc_root="/nonexistent"), "node-1")
    agent.nvml_ready = True
    figures = {"model": "NVIDIA H100 80GB HBM3", "sm_percent": 37.5, "memory_used_bytes": 1.5e9,
               "memory_total_bytes": 8.5e10, "power_watts": 350.25, "power_limit_watts": 700.0,
               "temperature_celsius": 61.0, "sm_clock_mhz": 1980.0, "memory_clock_mhz": 2619.0,
               "memory_activity_percent": 12.0, "memory_utilization_percent": 2.0,
               "pcie_rx_bytes_per_second": 1024.0, "pcie_tx_bytes_per_second": 2048.0}
    figures = {name: value for name, value in figures.items() if name in GpuSample.model_fields}
    for gpu in range(GPUS):
        uuid = f"GPU-{gpu:04d}"
        agent.state.samples.append(GpuSample.model_validate(
            {"t": NOW - 1, "node": "node-1", "uuid": uuid, "index": gpu, "energy_joules": 1e6 + gpu, **figures}))
        agent.state.counters[uuid] = DeviceCounters(
            active_seconds_total=42.0, last_sample_t=NOW - 1, last_active_t=NOW - 1, first_seen_t=NOW - 100,
            unattributed_samples_total=3)
        holders = [(f"MIG-{gpu}-{i}", f"p-{gpu}-{i}") for i in range(MIG_INSTANCES)] if mig else [(uuid, f"p-{gpu}")]
        for device, pod in holders:
            if mig:
                agent.state.samples.append(GpuSample.model_validate(
                    {"t": NOW - 1, "node": "node-1", "uuid": device, "index": gpu, "parent_uuid": uuid,
                     "mig_profile": "1g.10gb", "device_units": 1 / MIG_INSTANCES, **figures}))
                agent.state.counters[device] = DeviceCounters(first_seen_t=NOW - 50)
            agent.state.devices.append(AgentDevice(
                uuid=device, device_id=device, units=1 / MIG_INSTANCES if mig else 1.0, state="active",
                namespace="team-a", pod=pod, container="main"))
            agent.state.pod_stats.append(PodStatsSample(
                t=NOW - 5, node="node-1", namespace="team-a", pod=pod, pod_uid=pod, cpu_usage_cores=2.5,
                memory_used_bytes=1e9))
    agent.state.polls_total, agent.state.last_poll_seconds = 12, 0.003
    return agent


def render_function(module: Any, agent: Agent, process: bool) -> Callable[[], bytes]:
    """The module's render at NOW: an older tree's renderer takes `render(now)`, a newer one a clock."""
    if "clock" in inspect.signature(module.MetricsRenderer).parameters:
        return module.MetricsRenderer(agent, process_metrics=process, clock=lambda: NOW).render  # type: ignore[no-any-return]
    renderer = module.MetricsRenderer(agent, process_metrics=process)
    return lambda: renderer.render(NOW)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--module", type=Path, help="another copy of gpuwm/agent/metrics.py to time")
    args = parser.parse_args()
    if args.module is None:
        import gpuwm.agent.metrics as module
    else:
        spec = importlib.util.spec_from_file_location("metrics_under_test", args.module)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    for mig in (False, True):
        for process in (True, False):
            render = render_function(module, filled_agent(mig), process)
            body = render()
            number = 100 if mig else 500
            runs = [min(timeit.Timer(render, timer=time.process_time).repeat(5, number)) / number * 1e3
                    for _ in range(args.runs)]
            shape = f"{GPUS} GPUs x {MIG_INSTANCES} MIG, {GPUS * MIG_INSTANCES} pods" if mig else f"{GPUS} GPUs, {GPUS} pods"
            print(f"{shape}, {'with' if process else 'without'} process figures: "
                  f"median {statistics.median(runs):.3f} ms ({', '.join(f'{run:.3f}' for run in runs)}), "
                  f"{len(body):,} bytes")


if __name__ == "__main__":
    main()
