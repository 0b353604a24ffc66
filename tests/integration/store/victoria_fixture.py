"""Start Debian's `victoria-metrics` on loopback over a fresh data directory, and import samples into it.

Found on PATH; a test that needs it is skipped with the reason where it is missing, except under CI
(CI=true), where .ci/run installs it and a missing one fails instead of skipping silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.store.prometheus_fixture import free_port

VICTORIA_METRICS = shutil.which("victoria-metrics")
MISSING = "victoria-metrics not installed (Debian: apt-get install victoria-metrics)"


def require_victoria_metrics() -> str:
    """The binary's path; skip (fail under CI) where it is missing."""
    if VICTORIA_METRICS is None:
        if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
            pytest.fail(f"the VictoriaMetrics tests must run under CI, but {MISSING}; .ci/run installs it",
                        pytrace=False)
        pytest.skip(MISSING)
    return VICTORIA_METRICS


@contextmanager
def running_victoria_metrics(workdir: Path) -> Iterator[str]:
    """VictoriaMetrics on 127.0.0.1:<free port> keeping data of any age; yields its base URL; stopped on exit."""
    binary = require_victoria_metrics()
    port = free_port()
    log_path = workdir / "victoria-metrics.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [binary, f"-storageDataPath={workdir / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{port}",
             "-retentionPeriod=100y", "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"victoria-metrics did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def import_openmetrics(base: str, openmetrics: str) -> None:
    """Samples written as OpenMetrics with timestamps in seconds (`OpenMetricsBackfill.write`), imported through
    /api/v1/import/prometheus (timestamps in milliseconds) and flushed so that queries see them."""
    lines = []
    for line in openmetrics.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value, seconds = line.rsplit(" ", 2)
        lines.append(f"{series} {value} {round(float(seconds) * 1000)}")
    request = urllib.request.Request(f"{base}/api/v1/import/prometheus", data="\n".join(lines).encode() + b"\n",
                                     method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status in (200, 204), response.read()
    with urllib.request.urlopen(f"{base}/internal/force_flush", timeout=60) as response:
        assert response.status == 200
