"""The agent's HTTP server under clients that hold connections: a head sent a line at a time is cut off at
the header timeout, an answer nobody reads at the write timeout, a body at the body timeout; past the
connection cap the connection waiting longest goes first, and a real request is answered meanwhile."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from gpuwm.agent import server as agent_server
from gpuwm.agent.core import Agent
from gpuwm.agent.metrics import MetricsRenderer
from gpuwm.agent.server import AgentHTTPServer, ConnectionLimits, serve_in_thread
from gpuwm.config import Settings

Serve = Callable[[ConnectionLimits], AgentHTTPServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    started: list[tuple[AgentHTTPServer, threading.Thread]] = []

    def start(limits: ConnectionLimits) -> AgentHTTPServer:
        agent = Agent(Settings(pod_resources_socket="/nonexistent.sock", proc_root="/nonexistent"), "node-1")
        server = AgentHTTPServer(("127.0.0.1", 0), agent, MetricsRenderer(agent, process_metrics=False).render, limits)
        started.append((server, serve_in_thread(server)))
        return server

    yield start
    for server, thread in started:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def _closed(connection: socket.socket, within_seconds: float) -> bool:
    """Whether the server closes `connection` within the time (end of file, or a reset)."""
    connection.settimeout(within_seconds)
    try:
        while connection.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _healthz(server: AgentHTTPServer) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/healthz", timeout=5) as response:
        return int(response.status)


def test_defaults_bound_connections() -> None:
    limits = ConnectionLimits()
    assert limits.header_timeout_seconds == agent_server.HEADER_TIMEOUT_SECONDS <= 30
    assert limits.body_timeout_seconds <= 30 and limits.write_timeout_seconds <= 60
    assert limits.max_connections == agent_server.MAX_CONNECTIONS <= 64


def test_a_head_sent_a_line_at_a_time_is_cut_off(serve: Serve) -> None:
    server = serve(ConnectionLimits(header_timeout_seconds=1.0))
    slow = socket.create_connection(("127.0.0.1", server.server_address[1]))
    started = time.monotonic()
    slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    closed = False
    for index in range(20):  # a header line every 0.2 s: each read is prompt, the head never ends
        try:
            slow.sendall(f"X-Slow-{index}: y\r\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        if _closed(slow, 0.2):
            closed = True
            break
    waited = time.monotonic() - started
    assert closed and 0.9 <= waited < 3.0, waited
    slow.close()


def test_an_answer_nobody_reads_is_abandoned(serve: Serve) -> None:
    """A client that asks for a large answer and never reads it holds its connection the write timeout at most."""
    server = serve(ConnectionLimits(write_timeout_seconds=1.0, max_connections=4))
    server.render_metrics = lambda: b"x" * (64 << 20)  # more than the socket buffers hold
    reader = socket.create_connection(("127.0.0.1", server.server_address[1]))
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    deadline = time.monotonic() + 10
    while server.open_connections and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.open_connections == 0
    reader.close()
    assert _healthz(server) == 200


def test_a_body_is_drained_for_the_body_timeout_at_most(serve: Serve) -> None:
    server = serve(ConnectionLimits(body_timeout_seconds=1.0))
    client = socket.create_connection(("127.0.0.1", server.server_address[1]))
    client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + b"y" * 100)
    client.settimeout(5)
    assert client.recv(4096).startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    assert _closed(client, 5.0)  # the rest of the body never comes: closed after the body timeout
    assert time.monotonic() - started < 3.0
    client.close()


def test_past_the_cap_the_slowest_waiting_connection_goes_first(serve: Serve) -> None:
    server = serve(ConnectionLimits(max_connections=8, header_timeout_seconds=30.0))
    port = server.server_address[1]
    before = threading.active_count()
    oldest = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    deadline = time.monotonic() + 5
    while server.open_connections < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    newer = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    # room was made by closing the four that had waited longest, in order; the newer ones stay
    assert [_closed(connection, 2.0) for connection in oldest[:4]] == [True] * 4
    assert not any(_closed(connection, 0.2) for connection in oldest[4:] + newer)
    assert server.dropped_connections == 4 and server.open_connections == 8
    # a real request still gets through (and closes one more waiting connection to make room)
    assert _healthz(server) == 200
    # no thread per connection
    assert threading.active_count() - before <= 1
    for connection in oldest + newer:
        with contextlib.suppress(OSError):
            connection.close()
