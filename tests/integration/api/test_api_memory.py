"""20 concurrent worst-case queries against a real `gpuwm api` process: its memory stays bounded.

The store holds 60 GPUs with a few samples each; a cluster query of all 19 metrics by GPU over 11,000
steps would answer 60 x 19 x 11,000 = 12.5 million points (GBs of Python objects and JSON) per
request without the per-answer limit. With the defaults, that is refused before the store is read,
and queries just under the limit are heavy: at most half of apiMaxConcurrentQueries at a time (the rest
wait their turn, 429 past the queue).
A watchdog kills the process past the limit below, so the test fails rather than the machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from gpuwm.model.figures import ClusterFigures
from gpuwm.store.base import METRIC_NAMES
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.store_data import sample

#: the chart's memory limit of the controller (controller.resources.limits.memory: 1Gi)
LIMIT_BYTES = 1 << 30
GPUS = 60
START, STEP = 1000.0, 15.0


def _store(path: Path) -> None:
    store = EmbeddedStore(path)
    for index in range(4):
        t = START + STEP * index
        samples = [sample(t, f"gpu-{g}", node=f"node-{g // 8}", sm=50) for g in range(GPUS)]
        store.record(t, samples, [], [], ClusterFigures(gpus=GPUS, healthy_gpus=GPUS, total_gpu_units=GPUS))
    store.close()


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_twenty_worst_case_queries_stay_within_the_memory_limit(tmp_path: Path) -> None:
    _store(tmp_path / "gpuwm.db")
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwm.cli", "api", "--store", str(tmp_path / "gpuwm.db"), "--auth", "none",
         "--api-tls=false", "--api-listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "api.log").open("w"),
    )
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and process.poll() is None:
            peak[0] = max(peak[0], _rss_bytes(process.pid))
            if peak[0] > LIMIT_BYTES:
                os.kill(process.pid, signal.SIGKILL)  # as the kernel would at the container's limit
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()[-2000:]
                time.sleep(0.2)
        watcher.start()
        every = ",".join(METRIC_NAMES)
        end = START + STEP * 10_999
        worst = {"metric": every, "by": "gpu", "start": str(START), "end": str(end), "step": str(STEP)}
        # just under the default limit of 2,000,000: 60 GPUs x every metric x as many points as fit
        points = 2_000_000 // (60 * len(METRIC_NAMES))
        under = {**worst, "end": str(START + STEP * (points - 1))}

        async def fire(params: dict[str, str]) -> list[int]:
            async with httpx.AsyncClient(timeout=300) as client:
                answers = await asyncio.gather(*(
                    client.get(f"http://127.0.0.1:{port}/api/v1/cluster/metrics", params=params) for _ in range(20)
                ), return_exceptions=True)
            return [a.status_code if isinstance(a, httpx.Response) else -1 for a in answers]

        worst_statuses = asyncio.run(fire(worst))
        under_statuses = asyncio.run(fire(under))
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(timeout=5)
        alive = process.poll() is None
        process.terminate()
        process.wait(timeout=30)
    assert alive, f"gpuwm api was killed at {peak[0] / 2**20:.0f} MiB (over {LIMIT_BYTES / 2**20:.0f} MiB)"
    # each refused for its size once admitted; those past the user's queue are refused for that at once
    assert worst_statuses.count(400) >= 16 and set(worst_statuses) <= {400, 429}, worst_statuses
    assert under_statuses.count(200) >= 2 and set(under_statuses) <= {200, 429}, under_statuses
    assert peak[0] < LIMIT_BYTES
    print(f"peak RSS {peak[0] / 2**20:.0f} MiB; under-limit answers {sorted(under_statuses)}")
