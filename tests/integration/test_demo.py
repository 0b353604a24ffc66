"""`gpuwm demo` as a user runs it: a subprocess on a free loopback port, read over HTTP, stopped by SIGINT."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpuwm.sim.workloads import ALL_NAMESPACES

pytestmark = pytest.mark.integration

URL_LINE = re.compile(r"dashboard (http://127\.0\.0\.1:\d+/)")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


class Demo:
    def __init__(self, *arguments: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpuwm.cli", "demo", "--listen", "127.0.0.1:0", "--no-table", *arguments],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: list[str] = []
        self.url_found = threading.Event()
        self.url = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            match = URL_LINE.search(line)
            if match and not self.url:
                self.url = match.group(1)
                self.url_found.set()

    def stop(self, signum: int = signal.SIGINT) -> tuple[int, str]:
        self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        self._reader.join(timeout=5)
        assert self.process.stderr is not None
        return code, self.process.stderr.read()


@pytest.fixture
def demo() -> Iterator[Demo]:
    running = Demo("--nodes", "3", "--gpus-per-node", "2", "--speed", "120", "--warmup", "10m", "--seed", "4",
                   "--interval", "2s", "--status-interval", "10s", "--faults")
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()


def wait_for_workloads(url: str, deadline: float) -> list[dict[str, Any]]:
    while time.monotonic() < deadline:
        try:
            workloads = get_json(url + "api/v1/workloads")
        except OSError:
            workloads = None
        items = workloads.get("workloads") if isinstance(workloads, dict) else None
        if items and any(item.get("allocatedGpus", 0) > 0 for item in items):
            return list(items)
        time.sleep(0.3)
    raise AssertionError("the demo's API never listed running workloads")


def test_demo_serves_simulated_workloads_and_stops_on_sigint(demo: Demo) -> None:
    assert demo.url_found.wait(20), f"no dashboard URL printed; output: {demo.lines}"
    workloads = wait_for_workloads(demo.url, time.monotonic() + 25)
    namespaces = {name for name, _ in ALL_NAMESPACES}
    for item in workloads:
        assert item["namespace"] in namespaces
        split = item["activeGpuSeconds"] + item["idleGpuSeconds"] + item["unmonitoredGpuSeconds"]
        assert item["allocatedGpuSeconds"] == pytest.approx(split, rel=1e-9, abs=1e-6)
        assert 0 <= item["allocatedGpus"] <= 8
        lifetime = item["utilization"]["lifetime"]
        assert lifetime is None or 0 <= lifetime <= 100
    assert any(item["activeGpuSeconds"] > 0 for item in workloads)
    assert any(item["kind"] in {"PyTorchJob", "Job", "Notebook", "Deployment"} for item in workloads)
    with urllib.request.urlopen(demo.url, timeout=10) as response:
        assert response.status == 200 and b"<html" in response.read().lower()
    cluster = get_json(demo.url + "api/v1/cluster/metrics?metric=gpu_allocated&step=30s")
    points = [value for series in cluster["series"] for _, value in series["points"] if value is not None]
    assert points and max(points) > 0
    code, stderr = demo.stop(signal.SIGINT)
    assert code == 0, stderr
    assert any("stopped at simulated" in line for line in demo.lines)
    assert "Traceback" not in stderr


def test_demo_api_agrees_with_the_simulators_ground_truth(demo: Demo) -> None:
    """`/demo/truth` is what the simulator generated; `/api/v1/workloads`, read between two answers of the same
    interval, says the same for every workload: GPU-seconds by kind, the faults' unmonitored time included."""
    assert demo.url_found.wait(20), f"no dashboard URL printed; output: {demo.lines}"
    wait_for_workloads(demo.url, time.monotonic() + 25)
    deadline = time.monotonic() + 20
    while True:
        before = get_json(demo.url + "demo/truth")
        workloads = get_json(demo.url + "api/v1/workloads")["workloads"]
        after = get_json(demo.url + "demo/truth")
        if before["at"] == after["at"] and not after["recording"]:
            break
        assert time.monotonic() < deadline, "no two answers of /demo/truth from the same interval"
    reported = {(item["namespace"], item["name"]): item for item in workloads}
    compared = 0
    for expected in before["workloads"]:
        item = reported.get((expected["namespace"], expected["name"]))
        assert item is not None, f"{expected['namespace']}/{expected['name']} is in the truth, not in the API"
        for field in ("allocatedGpuSeconds", "activeGpuSeconds", "idleGpuSeconds", "unmonitoredGpuSeconds"):
            assert item[field] == pytest.approx(expected[field], abs=1e-6), (expected["name"], field)
        compared += 1
    assert compared == len(reported) > 0
    assert sum(expected["allocatedGpuSeconds"] for expected in before["workloads"]) > 0
    code, stderr = demo.stop(signal.SIGINT)
    assert code == 0, stderr
    assert any(line.strip().startswith("ground truth") for line in demo.lines)  # the comparison, printed


def test_demo_refuses_a_bad_fleet_with_a_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuwm.cli", "demo", "--nodes", "0", "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "--nodes" in result.stderr


def test_demo_on_a_taken_port_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "gpuwm.cli", "demo", "--listen", f"127.0.0.1:{port}", "--warmup", "1m"],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 2
    assert f"--listen 127.0.0.1:{port}: cannot listen there" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def aged_demo() -> Iterator[Demo]:
    """A demo whose earlier runs are older than its finest tier keeps (10 minutes of 15 s points)."""
    running = Demo("--nodes", "6", "--gpus-per-node", "4", "--speed", "10", "--warmup", "2h", "--seed", "7",
                   "--interval", "2s", "--status-interval", "15s", "--store-rollups", "15s:10m,1m:1d")
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()


def _interval_snapshot(url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """/demo/truth and /api/v1/workloads of one recorded interval (two answers of the truth around the list)."""
    deadline = time.monotonic() + 20
    while True:
        before = get_json(url + "demo/truth")
        workloads = get_json(url + "api/v1/workloads?ended=true")["workloads"]
        after = get_json(url + "demo/truth")
        if before["at"] == after["at"] and not after["recording"]:
            return before, workloads
        assert time.monotonic() < deadline, "no two answers of /demo/truth from the same interval"


def test_every_finished_runs_row_is_the_truth_over_any_period_that_holds_it(aged_demo: Demo) -> None:
    assert aged_demo.url_found.wait(60), f"no dashboard URL printed; output: {aged_demo.lines}"
    url = aged_demo.url
    deadline = time.monotonic() + 240
    while not any("warm-up done" in line for line in aged_demo.lines):
        assert time.monotonic() < deadline and aged_demo.process.poll() is None, aged_demo.lines
        time.sleep(0.5)
    truth, workloads = _interval_snapshot(url)
    # the runs that ended having held GPUs (a run ended while queued has no row in any report)
    finished = {(w["namespace"], w["name"]): w for w in workloads
                if w.get("endTime") is not None and w["allocatedGpuSeconds"] > 0}
    assert len(finished) >= 3, "the demo finished too few runs to compare"
    expected = {(t["namespace"], t["name"]): t for t in truth["workloads"]}
    now = truth["at"]
    reports = {name: get_json(url + f"api/v1/report?by=workload&start={start}")
               for name, start in (("1d", now - 86400), ("7d", now - 7 * 86400), ("30d", now - 30 * 86400),
                                   ("365d", now - 365 * 86400), ("all time", 0))}
    for name, report in reports.items():
        rows = {(row["namespace"], row["workload"]): row for row in report["rows"]}
        for key, run in finished.items():
            row, generated = rows[key], expected[key]
            for column, field in (("allocated", "allocatedGpuSeconds"), ("active", "activeGpuSeconds"),
                                  ("idle", "idleGpuSeconds"), ("unmonitored", "unmonitoredGpuSeconds")):
                assert row[f"{column}GpuHours"] * 3600 == pytest.approx(generated[field], abs=2e-3), (name, key, field)
            assert row["energyJoules"] == pytest.approx(run["energyJoules"], abs=2e-3), (name, key)
            assert row["exact"] is True, (name, key)
    # periods add up: all time cut at a run's middle, per project
    middle = now - 20 * 60
    whole = get_json(url + f"api/v1/report?start=0&end={now}")
    parts = [get_json(url + f"api/v1/report?start=0&end={middle}"),
             get_json(url + f"api/v1/report?start={middle}&end={now}")]
    for row in whole["rows"]:
        summed = sum(r["allocatedGpuHours"] for part in parts for r in part["rows"] if r["project"] == row["project"])
        assert summed == pytest.approx(row["allocatedGpuHours"], abs=1e-6)
    # a finished run older than the finest tier: its whole life at the stored resolution, no empty cells inside
    oldest = min(finished.values(), key=lambda w: w["endTime"])
    series = get_json(url + f"api/v1/workloads/{oldest['uid']}/metrics?metric=gpu_allocated")
    values = [value for _, value in series["series"][0]["points"]]
    present = [index for index, value in enumerate(values) if value is not None]
    assert present and all(values[index] is not None for index in range(present[0], present[-1] + 1))
    assert series["stepSeconds"] >= 60.0 and any(s["tier"] == "1m:1d" for s in series["resolution"])
    code, stderr = aged_demo.stop(signal.SIGINT)
    assert code == 0, stderr
