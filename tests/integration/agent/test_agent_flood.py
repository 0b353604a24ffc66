"""A running `gpuwm agent` while 40 slow clients hold its connections (each sends its request head a line every
2 s and reconnects the moment it is closed): the kubelet's probes and the controller's pull still get in."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.integration.agent.helpers import RunningAgent, http_get
from tests.slowclients import SlowClients

pytestmark = pytest.mark.integration

#: the chart's probes give the agent this long to answer (timeoutSeconds)
PROBE_TIMEOUT_SECONDS = 5.0
FLOOD_SECONDS = 15.0


def test_probes_and_the_pull_get_through_forty_slow_clients(
    start_agent: Callable[..., RunningAgent], fake_nvml_lib: Path, scenario: Path
) -> None:
    agent = start_agent(fake_nvml_lib, scenario, "--interval", "0.5")
    address = urlsplit(agent.url)
    assert address.hostname is not None and address.port is not None
    clients = SlowClients(address.hostname, address.port, count=40, line_seconds=2.0)
    clients.start()
    answers: dict[str, list[int]] = {"/healthz": [], "/readyz": [], "/v1/snapshot?since=0&format=columns": []}
    slowest = 0.0
    try:
        time.sleep(3.0)  # every client has its connection, and has sent some lines
        deadline = time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < deadline:
            for path, statuses in answers.items():
                started = time.monotonic()
                status, _ = http_get(agent.url + path)  # a new connection each time, as the kubelet's probe
                slowest = max(slowest, time.monotonic() - started)
                statuses.append(status)
            time.sleep(0.5)
    finally:
        clients.stop()
    assert clients.connections_opened >= 40
    for path, statuses in answers.items():
        assert statuses and set(statuses) == {200}, (path, statuses, agent.log()[-2000:])
    assert slowest < PROBE_TIMEOUT_SECONDS, slowest
    assert agent.process.poll() is None
