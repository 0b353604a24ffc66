"""The agent's HTTP server under connections that send nothing (issue 34): each is closed after the read
timeout, at most `max_connections` hold a thread, and a real request is still answered meanwhile."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from gpuwm.agent import server as agent_server
from gpuwm.agent.core import Agent
from gpuwm.agent.metrics import MetricsRenderer
from gpuwm.agent.server import AgentHTTPServer, serve_in_thread
from gpuwm.config import Settings


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentHTTPServer]:
    monkeypatch.setattr(agent_server._Handler, "timeout", 1.0)
    agent = Agent(Settings(pod_resources_socket="/nonexistent.sock", proc_root="/nonexistent"), "node-1")
    server = AgentHTTPServer(("127.0.0.1", 0), agent, MetricsRenderer(agent, process_metrics=False).render,
                             max_connections=8)
    thread = serve_in_thread(server)
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()



def test_defaults_bound_connections() -> None:
    assert agent_server._Handler.timeout == agent_server.READ_TIMEOUT_SECONDS <= 30
    assert agent_server.MAX_CONNECTIONS <= 64


def test_silent_connections_are_capped_and_closed(served: AgentHTTPServer) -> None:
    port = served.server_address[1]
    before = threading.active_count()
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
    try:
        deadline = time.monotonic() + 5
        while served.refused_connections < 100 - served.max_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        # at most max_connections threads were made for 100 connections that send nothing
        assert threading.active_count() - before <= served.max_connections
        assert served.refused_connections >= 100 - served.max_connections
        # those past the cap were closed at once: reading gives end-of-file
        closed = 0
        for connection in silent:
            connection.settimeout(0.01)
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                closed += connection.recv(1) == b""
        assert closed >= 100 - served.max_connections
        # the held ones are closed after the read timeout (1 s here), and the server answers again
        deadline = time.monotonic() + 5
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= before
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status in (200, 503)
    finally:
        for connection in silent:
            connection.close()
