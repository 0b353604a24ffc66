"""Start the Debian `prometheus` binary on loopback over a TSDB backfilled with `promtool` (or written to)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.model import GpuSample, PodStatsSample
from gpuwm.model.figures import ProjectFigures, WorkloadFigures
from gpuwm.store import Store

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = "prometheus/promtool not installed (Debian: apt-get install prometheus)"
#: the marks of a test module over the real prometheus: `pytestmark = REAL_PROMETHEUS`
REAL_PROMETHEUS = [pytest.mark.integration, pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason=MISSING)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def backfill(openmetrics: Path, tsdb: Path) -> None:
    assert PROMTOOL is not None
    tsdb.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")


@contextmanager
def running_prometheus(
    tsdb: Path,
    workdir: Path,
    *,
    remote_write: bool = False,
    query_timeout: str | None = None,
    max_samples: int | None = None,
    extra_args: Sequence[str] = (),
    processes: list[subprocess.Popen[bytes]] | None = None,
) -> Iterator[str]:
    """Prometheus over `tsdb` on 127.0.0.1:<free port>; yields its base URL; stopped on exit.

    `remote_write` accepts remote-write requests at /api/v1/write (bench/api.py loads through it);
    `query_timeout` ("30m") and `max_samples` raise the query limits for big queries; the process
    is appended to `processes` for callers that read its memory.
    """
    assert PROMETHEUS is not None
    options = list(extra_args)
    if remote_write:
        options.append("--web.enable-remote-write-receiver")
    if query_timeout is not None:
        options.append(f"--query.timeout={query_timeout}")
    if max_samples is not None:
        options.append(f"--query.max-samples={max_samples}")
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=3650d",
                "--query.lookback-delta=20s",
                *options,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if processes is not None:
        processes.append(process)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def instant(base: str, query: str) -> list[dict[str, object]]:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(query)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.load(response)["data"]["result"])


@dataclass(frozen=True)
class Interval:
    """One status interval as the controller records it."""

    t: float
    samples: Sequence[GpuSample]
    workloads: Sequence[WorkloadFigures]
    projects: Sequence[ProjectFigures]
    gpus: int  # the cluster's GPU count
    pod_stats: Sequence[PodStatsSample] = ()


async def series_of(
    store: Store, url: str, metrics: Sequence[str], start: float, end: float, by: str | None = None
) -> dict[tuple[str, str], list[float | None]]:
    """The range API's answer to `url` over `store` (`metrics` from `start` to `end` by 15 s, broken down `by`):
    each series' points by (metric, pod)."""
    params: dict[str, Any] = {"metric": ",".join(metrics), "start": start, "end": end, "step": 15}
    if by is not None:
        params["by"] = by
    app = create_app(store, Settings(auth="none"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        response = await http.get(url, params=params)
    assert response.status_code == 200, response.text
    return {(s["metric"], s["labels"].get("pod", "")): [v for _, v in s["points"]] for s in response.json()["series"]}
