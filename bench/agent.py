"""Agent overhead: CPU per second and per GPU-second, RSS, against a bare loop of the same pynvml calls.

Runs a real `gpuwm agent` on the fake NVML library (tests/fakenvml) with 8 GPUs and 32 compute
processes at 1 Hz, a real pod-resources gRPC server and a fake /proc, scraping /metrics and pulling
/v1/snapshot every 10 s as Prometheus and the controller would. The fake spends in each call the CPU
the real driver does (`--no-driver-costs`: answers in microseconds). The bare loop
makes the agent's calls at the agent's schedule: the instant ones every poll, the buffered ones
(utilisation samples, energy) every `--nvml-buffer-read-seconds`; one pod per GPU, so no per-process
utilisation. Prints figures; asserts nothing.

    .venv/bin/python bench/agent.py [--seconds 60] [--gpus 8] [--processes 32] [--nvml-buffer-read-seconds 5]
        [--profile agent.prof]

Targets: <= 1 % of one core without the driver's costs, <= 1.2 % with them,
<= 60 MiB RSS, agent CPU per poll <= 3x the bare loop.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakenvml import build_fake_nvml, fake_nvml_env, write_scenario  # noqa: E402
from tests.fakenvml.podresources_server import FakePod, PodResourcesServer  # noqa: E402

from gpuwm.feed import MergeRequest  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: Prometheus scrapes and the controller pulls every this many seconds
PULL_SECONDS = 10.0

#: the NVML calls the agent makes per device at its schedule, for the bare loop: the instant calls every poll, the
#: buffered ones every read (a buffer read of 0: every poll, with per-process utilisation, as the agent did once). argv: polls, interval, buffer read seconds, the gauges' period (PCIe, and temperature, clocks and power
#: limit where the next is 1), 1 where temperature, clocks and power limit go with PCIe (else every poll), memory
#: activity from its own sample buffer (1, as the agent did once) or from the instant utilisation rates (0),
#: the energy counter's period (0: every read), and 1 where the device count is checked every poll (else every read)
BARE_LOOP = textwrap.dedent(
    """
    import sys, time, pynvml
    polls, interval, buffer_read, gauges_every = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    slow_gauges, energy_every, count_every_poll = sys.argv[5] == "1", float(sys.argv[7]), sys.argv[8] == "1"
    kinds = [pynvml.NVML_GPU_UTILIZATION_SAMPLES] + [pynvml.NVML_MEMORY_UTILIZATION_SAMPLES] * int(sys.argv[6])
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    cursor = int((time.time() - 1) * 1e6)
    started = time.process_time()
    gauges_at = read_at = energy_at = -1e9
    for _ in range(polls):
        time.sleep(interval)
        read_gauges = time.monotonic() - gauges_at >= gauges_every  # PCIe (20 ms a call) at most this often
        gauges_at = time.monotonic() if read_gauges else gauges_at
        read_buffers = time.monotonic() - read_at + interval / 2 >= buffer_read
        read_at = time.monotonic() if read_buffers else read_at
        read_energy = read_buffers and time.monotonic() - energy_at >= energy_every
        energy_at = time.monotonic() if read_energy else energy_at
        if count_every_poll or read_buffers:
            pynvml.nvmlDeviceGetCount()
        for h in handles:
            pynvml.nvmlDeviceGetMemoryInfo(h)
            pynvml.nvmlDeviceGetPowerUsage(h)
            if read_gauges or not slow_gauges:
                pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                pynvml.nvmlDeviceGetEnforcedPowerLimit(h)
                pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
                pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
            if read_gauges:
                pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
                pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            if len(kinds) == 1:
                pynvml.nvmlDeviceGetUtilizationRates(h)
            if read_buffers:
                for kind in kinds:
                    try:  # pynvml sizes its buffer in a first call: a sample arriving in between fails the second
                        pynvml.nvmlDeviceGetSamples(h, kind, cursor)
                    except pynvml.NVMLError_InsufficientSize:
                        pass
            if read_energy:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            if buffer_read <= 0:
                pynvml.nvmlDeviceGetProcessUtilization(h, cursor)
        if read_buffers:
            cursor = int((time.time() - 1) * 1e6)
    print(time.process_time() - started)
    """
)


#: `--profile`: `python -m gpuwm.cli` under cProfile timed by the poll thread's CPU (not wall: the PCIe call's 20 ms
#: wait would swamp it); argv: the stats file, then the CLI's arguments
PROFILED_AGENT = textwrap.dedent(
    """
    import cProfile, runpy, sys, time
    path, sys.argv = sys.argv[1], ["gpuwm", *sys.argv[2:]]
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    try:
        runpy.run_module("gpuwm.cli", run_name="__main__")
    finally:
        profile.disable()
        profile.dump_stats(path)
    """
)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scenario(gpus: int, processes: int) -> tuple[str, dict[int, tuple[int, str]]]:
    lines = ["driver version=550.54.15"]
    for index in range(gpus):
        lines.append(
            f"gpu uuid=GPU-{index:04d} memory_used_mib=20000 power_mw=400000 power_limit_mw=700000 "
            f"energy_mj=1000 temperature_c=60 sm_clock_mhz=1980 mem_clock_mhz=2619 pcie_rx_kbs=10 pcie_tx_kbs=20 "
            f"util=30/60/90 mem_util=40"
        )
    owners = {}
    for number in range(processes):
        pid, gpu = 20000 + number, number % gpus
        owners[pid] = (gpu, f"{gpu:08x}-0000-4000-8000-{number:012x}")
        lines.append(f"proc device=GPU-{gpu:04d} pid={pid} used_mib=2000 sm=20")
    return "\n".join(lines) + "\n", owners


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="measurement window after warm-up (whole 10 s pull periods; longer is more precise: "
                             "the agent's CPU is read in 10 ms clock ticks)")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=32)
    parser.add_argument("--pull", choices=PULL_QUERIES, default="merged",
                        help="the snapshot pull: merged columns (what `gpuwm controller` asks for), columns, rows")
    parser.add_argument("--nvml-buffer-read-seconds", type=float, default=5.0,
                        help="the agent's setting, and the bare loop's schedule of the buffered calls")
    parser.add_argument("--no-driver-costs", action="store_true",
                        help="the fake answers in microseconds instead of spending the real driver's CPU per call")
    parser.add_argument("--agent-root", type=Path, default=ROOT,
                        help="a checkout whose gpuwm agent to run (another commit's, for a before/after figure)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="run the agent under cProfile (its poll thread's CPU time) and write the stats here; the CPU figures "
                             "then include the profiler's own cost. Read with `python -m pstats PATH`")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpuwm-bench-") as temporary:
        work = Path(temporary)
        library = build_fake_nvml(work / "lib")
        text, owners = _scenario(options.gpus, options.processes)
        scenario = write_scenario(work / "scenario.txt", text)
        proc_root = work / "proc"
        for pid, (_, uid) in owners.items():
            (proc_root / str(pid)).mkdir(parents=True)
            (proc_root / str(pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n"
            )
        pod_resources = PodResourcesServer(work / "pr.sock")
        pod_resources.pods = [
            FakePod("bench", f"pod-{gpu}", {"main": [("nvidia.com/gpu", [f"GPU-{gpu:04d}"])]})
            for gpu in range(options.gpus)
        ]
        pod_resources.start()
        port = _free_port()
        env = fake_nvml_env(library, scenario)
        if options.no_driver_costs:
            env["FAKE_NVML_COST_SCALE"] = "0"
        agent_env = {**env, "PYTHONPATH": str(options.agent_root / "operator")}
        buffer_flag = ["--nvml-buffer-read-seconds", str(options.nvml_buffer_read_seconds)] if (
            "nvml_buffer_read_seconds" in (options.agent_root / "operator/gpuwm/config.py").read_text()) else []
        profiler = ["-c", PROFILED_AGENT, str(options.profile.resolve())] if options.profile else ["-m", "gpuwm.cli"]
        agent = subprocess.Popen(
            [sys.executable, *profiler, "agent", "--listen", f"127.0.0.1:{port}", "--interval", "1s",
             "--node-name", "bench", "--proc-root", str(proc_root), "--pod-resources-socket", str(pod_resources.socket_path),
             "--log-level", "warning", *buffer_flag],
            env=agent_env,
        )
        bare_schedule = str(options.nvml_buffer_read_seconds if buffer_flag else 0.0)
        bare_args = [bare_schedule, *_agent_schedule(options.agent_root)]
        pulls = max(1, round(options.seconds / PULL_SECONDS))  # the window is whole pull periods
        bare_polls = max(10, int(pulls * PULL_SECONDS) - 2)
        bare: subprocess.Popen[str] | None = None
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_listening(port, agent)
            time.sleep(options.warmup)
            # the bare loop runs at 1 Hz in the same window, so both see the same machine (load, caches)
            bare = subprocess.Popen(
                [sys.executable, "-c", BARE_LOOP, str(bare_polls), "1.0", *bare_args], env=env,
                stdout=subprocess.PIPE, text=True,
            )
            # the controller's first pull (everything since the start) opens the window; then every
            # PULL_SECONDS a scrape and a pull as Prometheus and the controller would, the last closing it
            polls_before, since = _pull(base, 0, options.pull)
            cpu_before, wall_before = _cpu_seconds(agent.pid), time.monotonic()
            peak_rss = _rss_mib(agent.pid)
            for number in range(1, pulls + 1):
                while time.monotonic() < wall_before + number * PULL_SECONDS:
                    peak_rss = max(peak_rss, _rss_mib(agent.pid))
                    time.sleep(min(0.5, max(0.0, wall_before + number * PULL_SECONDS - time.monotonic())))
                polls_after, since = _pull(base, since, options.pull)
            cpu = _cpu_seconds(agent.pid) - cpu_before
            wall = time.monotonic() - wall_before
            polls = polls_after - polls_before
            bare_out, _ = bare.communicate(timeout=options.seconds + 60)
            bare_slow = float(bare_out.strip()) / bare_polls
        finally:
            if bare is not None and bare.poll() is None:
                bare.kill()
                bare.wait()
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=10)
            pod_resources.stop()

        # and back to back (hot caches), for reference
        bare_hot = _bare(env, polls=300, interval=0.0, schedule=bare_args)

    agent_cpu_per_poll = cpu / max(1, polls)
    costs = "without the driver's costs" if options.no_driver_costs else "with the real driver's CPU per call"
    print(f"gpus={options.gpus} processes={options.processes} interval=1s window={wall:.1f}s polls={polls} "
          f"buffer read={bare_schedule}s (0: every poll); fake NVML {costs}; "
          f"agent from {options.agent_root}")
    print(f"agent CPU: {100 * cpu / wall:.3f} % of one core ({cpu:.2f} s CPU in {wall:.1f} s)   "
          f"target <= {1 if options.no_driver_costs else 1.2} %")
    print(f"agent CPU per GPU-second: {1000 * cpu / (wall * options.gpus):.3f} ms; the bare loop's: "
          f"{1000 * bare_slow / options.gpus:.3f} ms (ratio {agent_cpu_per_poll / bare_slow:.2f})")
    print(f"agent RSS: {peak_rss:.1f} MiB peak                                  target <= 60 MiB")
    print(f"agent CPU per poll (incl. its HTTP serving): {1000 * agent_cpu_per_poll:.2f} ms")
    print(f"bare pynvml loop CPU per poll: {1000 * bare_slow:.2f} ms at 1 Hz (same window, {bare_polls} polls), "
          f"{1000 * bare_hot:.2f} ms back to back")
    print(f"ratio agent/bare at 1 Hz: {agent_cpu_per_poll / bare_slow:.2f}   target <= 3")
    print(f"ratio agent/bare back to back: {agent_cpu_per_poll / bare_hot:.2f}")
    return 0


def _wait_listening(port: int, agent: subprocess.Popen[bytes], timeout_seconds: float = 60.0) -> None:
    """Until the agent accepts connections (a loaded machine, or the profiler, can slow its start past the warm-up)."""
    deadline = time.monotonic() + timeout_seconds
    while agent.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the agent did not listen on 127.0.0.1:{port} (exit status {agent.poll()})")


def _agent_schedule(agent_root: Path) -> list[str]:
    """The bare loop's gauges' period, whether temperature, clocks and power limit go with it, the memory-buffer
    flag, the energy counter's period and whether the device count is checked every poll, as the agent under
    `agent_root` has them (its source read)."""
    source = (agent_root / "operator/gpuwm/agent/nvml.py").read_text()
    gauges = re.search(r"^(?:GAUGES|PCIE_THROUGHPUT)_EVERY_SECONDS = ([0-9.]+)", source, re.MULTILINE)
    energy = re.search(r"^ENERGY_COUNTER_EVERY_SECONDS = ([0-9.]+)", source, re.MULTILINE)
    return [gauges.group(1) if gauges else "0", "1" if "GAUGES_EVERY_SECONDS" in source else "0",
            "1" if "NVML_MEMORY_UTILIZATION_SAMPLES" in source else "0", energy.group(1) if energy else "0",
            "1" if "or self._count_changed()" in source else "0"]


def _bare(env: dict[str, str], polls: int, interval: float, schedule: list[str]) -> float:
    """CPU seconds per poll of a loop making only the agent's pynvml calls (buffered ones every `schedule` s)."""
    result = subprocess.run(
        [sys.executable, "-c", BARE_LOOP, str(polls), str(interval), *schedule], env=env, capture_output=True, text=True,
        check=True,
    )
    return float(result.stdout.strip()) / polls


#: `--pull`: the snapshot query after `since=SEQ` (merged: the controller's defaults, 15 s, 1 %, 3 x 1 s)
PULL_QUERIES = {"merged": "&format=columns" + MergeRequest(15.0, 1.0, 3.0).query(), "columns": "&format=columns",
                "rows": ""}


def _pull(base: str, since: int, pull: str = "merged") -> tuple[int, int]:
    """A scrape and a snapshot pull: (the agent's poll count, the snapshot's seq for the next pull)."""
    polls = 0
    with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("gpuwm_agent_polls_total"):
                polls = int(float(line.rsplit(" ", 1)[1]))
    with urllib.request.urlopen(f"{base}/v1/snapshot?since={since}{PULL_QUERIES[pull]}", timeout=5) as response:
        return polls, int(json.load(response)["seq"])


if __name__ == "__main__":
    sys.exit(main())
