"""The agent under a flood of slow clients: its threads and RSS, and whether the probes and the pull get in.

Runs a real `gpuwm agent` on the fake NVML library (tests/fakenvml, the agent tests' scenario) at 1 Hz,
measures it quiet for `--quiet` seconds, then while `--clients` slow clients hold its connections for
`--seconds` (each sends `GET /metrics HTTP/1.1` and one header line every `--line-seconds`, and opens a
new connection the moment the agent closes its own: tests/slowclients.py). Every second, on a new
connection each, as the kubelet and the controller would: `/healthz`, `/readyz` and the controller's pull
(`/v1/snapshot?format=columns`). Prints figures; asserts nothing.

    .venv/bin/python bench/agent_flood.py [--clients 40] [--seconds 30] [--line-seconds 2]
        [--agent-root PATH]   # another checkout's agent (`git worktree add` or `git archive` of a commit)
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakenvml import build_fake_nvml, fake_nvml_env, write_scenario  # noqa: E402
from tests.integration.agent.helpers import SCENARIO  # noqa: E402
from tests.slowclients import SlowClients  # noqa: E402

#: what the chart's probes allow the agent (timeoutSeconds): an answer slower than this is a failed probe
PROBE_TIMEOUT_SECONDS = 5.0
PATHS = ("/healthz", "/readyz", "/v1/snapshot?since=0&format=columns")


@dataclass
class Window:
    """What one stretch of time saw: the agent's threads and RSS, and each path's answers."""

    threads: list[int] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    seconds: dict[str, list[float]] = field(default_factory=lambda: {path: [] for path in PATHS})
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))


def _status(pid: int) -> tuple[int, float]:
    """(threads, RSS MiB) of the process, from /proc."""
    threads, rss = 0, 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return threads, rss


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(url: str) -> tuple[bool, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_SECONDS) as response:
            response.read()
            ok = response.status == 200
    except (urllib.error.URLError, OSError):
        ok = False
    return ok, time.monotonic() - started


def _measure(base: str, pid: int, seconds: float) -> Window:
    window = Window()
    cpu_before, started = _cpu_seconds(pid), time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        tick = time.monotonic()
        threads, rss = _status(pid)
        window.threads.append(threads)
        window.rss_mib.append(rss)
        for path in PATHS:
            ok, took = _get(base + path)
            window.seconds[path].append(took)
            window.failed[path] += not ok
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    window.cpu_seconds, window.wall_seconds = _cpu_seconds(pid) - cpu_before, time.monotonic() - started
    return window


def _report(name: str, window: Window) -> None:
    print(f"{name}: agent threads {min(window.threads)}..{max(window.threads)}, "
          f"RSS {min(window.rss_mib):.1f}..{max(window.rss_mib):.1f} MiB, "
          f"CPU {100 * window.cpu_seconds / window.wall_seconds:.1f} % of one core")
    for path in PATHS:
        took = window.seconds[path]
        print(f"  {path:42s} {len(took) - window.failed[path]:3d}/{len(took):3d} answered within "
              f"{PROBE_TIMEOUT_SECONDS:g} s; median {1000 * statistics.median(took):7.1f} ms, "
              f"max {1000 * max(took):7.1f} ms")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=30.0, help="the flood's length")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds measured before the flood")
    parser.add_argument("--line-seconds", type=float, default=2.0, help="each slow client sends a header line this often")
    parser.add_argument("--agent-root", type=Path, default=ROOT, help="a checkout whose gpuwm agent to run")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwm-flood-") as temporary:
        work = Path(temporary)
        library = build_fake_nvml(work / "lib")
        scenario = write_scenario(work / "scenario.txt", SCENARIO)
        port = _free_port()
        env = {**fake_nvml_env(library, scenario), "PYTHONPATH": str(options.agent_root / "operator")}
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpuwm.cli", "agent", "--listen", f"127.0.0.1:{port}", "--interval", "1s",
             "--node-name", "bench", "--pod-resources-socket", str(work / "none.sock"), "--log-level", "error"],
            env=env, cwd=work,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not _get(base + "/readyz")[0]:
                if time.monotonic() > deadline or agent.poll() is not None:
                    raise SystemExit("the agent did not start")
                time.sleep(0.2)
            quiet = _measure(base, agent.pid, options.quiet)
            clients = SlowClients("127.0.0.1", port, count=options.clients, line_seconds=options.line_seconds)
            clients.start()
            try:
                flood = _measure(base, agent.pid, options.seconds)
            finally:
                clients.stop()
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
    print(f"agent from {options.agent_root}; {os.cpu_count()} CPUs; {options.clients} slow clients, a header line "
          f"every {options.line_seconds:g} s, reconnecting at once; {clients.connections_opened} connections in "
          f"{options.seconds:g} s")
    _report("quiet", quiet)
    _report("flood", flood)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
