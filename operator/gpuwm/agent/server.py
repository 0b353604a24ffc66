"""The agent's HTTP server: `/metrics`, `/v1/snapshot`, `/healthz`, `/readyz`.

The standard library's threading server keeps the agent small (no event loop, no framework);
every handler only reads the agent's cached state.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpuwm.agent.core import SNAPSHOT_LIMIT_RECORDS, Agent
from gpuwm.feed import DEVICES_TAG_PARAM, SNAPSHOT_FORMATS, merge_request

log = logging.getLogger(__name__)

#: a connection that sends nothing (a request head, or the next request on a kept-alive one) for this
#: long is closed: each connection holds a thread, and half-open ones must not pile up
READ_TIMEOUT_SECONDS = 10.0
#: connections served at once (the controller keeps one or two, Prometheus one); more are closed at once
MAX_CONNECTIONS = 32


def _non_negative(query: dict[str, list[str]], name: str, default: int) -> int | str:
    """The integer parameter, or an error message naming it."""
    values = query.get(name)
    if not values:
        return default
    try:
        value = int(values[-1])
    except ValueError:
        value = -1
    if value < 0:
        return f"{name}={values[-1]!r}: expected an integer >= 0"
    return value


class _Handler(BaseHTTPRequestHandler):
    server: AgentHTTPServer
    protocol_version = "HTTP/1.1"
    timeout = READ_TIMEOUT_SECONDS  # socketserver sets it on the connection: every read waits at most this

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: object) -> None:
        self._send(status, json.dumps(payload, separators=(",", ":")).encode(), "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        agent = self.server.agent
        try:
            if url.path == "/metrics":
                self._send(200, self.server.render_metrics(), CONTENT_TYPE_LATEST)
            elif url.path == "/v1/snapshot":
                query = parse_qs(url.query)
                since = _non_negative(query, "since", 0)
                limit = _non_negative(query, "limit", SNAPSHOT_LIMIT_RECORDS)
                if isinstance(since, str) or isinstance(limit, str):
                    self._json(400, {"error": since if isinstance(since, str) else limit})
                    return
                form = (query.get("format") or ["rows"])[-1]
                if form not in SNAPSHOT_FORMATS:
                    self._json(400, {"error": f"format={form!r}: expected rows (the default) or columns"})
                    return
                try:
                    merge = merge_request(query)
                except ValueError as error:
                    self._json(400, {"error": str(error)})
                    return
                tags = query.get(DEVICES_TAG_PARAM)
                tag = tags[-1] if tags else None  # any text: only an equal tag leaves the devices out
                self._send(200, agent.snapshot_json(since, max(1, limit), form == "columns", merge, tag),
                           "application/json")
            elif url.path in ("/healthz", "/readyz"):
                ok, reason = agent.liveness() if url.path == "/healthz" else agent.readiness()
                self._send(200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._json(404, {"error": f"{url.path} not found; try /metrics, /v1/snapshot, /healthz, /readyz"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away


class AgentHTTPServer(ThreadingHTTPServer):
    """Threaded HTTP server bound to one agent; `render_metrics` writes the `/metrics` body."""

    daemon_threads = True
    request_queue_size = 128  # listen backlog: a burst is accepted (and refused past the cap) at once, not in SYN retries
    timeout = 0.0  # handle_request(): a connection that went away before accept() is not waited for

    def __init__(
        self,
        address: tuple[str, int],
        agent: Agent,
        render_metrics: Callable[[], bytes],
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.agent = agent
        self.render_metrics = render_metrics
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused_connections = 0
        super().__init__(address, _Handler)
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._stopping = False
        self._stopped = threading.Event()
        self._stopped.set()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, at most `max_connections` at once; past that the connection is closed
        unanswered (a flood of connections costs no threads)."""
        if not self._slots.acquire(blocking=False):
            self.refused_connections += 1
            log.warning("agent HTTP: %d connections open, closing one from %s", self.max_connections, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until `shutdown()`, asleep in select between requests (`poll_interval` is not used).

        socketserver's own loop wakes every `poll_interval` to look for a shutdown request, a cost next
        to the agent's own polling; here `shutdown()` wakes it instead.
        """
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_reader, selectors.EVENT_READ)
                while not self._stopping:
                    for key, _ in selector.select():
                        if key.fileobj is self and not self._stopping:
                            self.handle_request()  # ready now; with `timeout` 0 it never waits
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait until it has returned."""
        self._stopping = True
        self._wake_writer.send(b"\0")
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake_reader.close()
        self._wake_writer.close()


def serve_in_thread(server: AgentHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="gpuwm-agent-http", daemon=True)
    thread.start()
    return thread
