"""The agent's HTTP server: `/metrics`, `/v1/snapshot`, `/healthz`, `/readyz`.

aiohttp's low-level server on an event loop of its own thread: a connection costs a little memory, not a
thread, so a crowd of slow clients cannot take the slots the controller's pull, Prometheus' scrape and the
kubelet's probes need. What bounds a connection:

- its request head: a connection that has not sent a whole head within `header_timeout_seconds` of
  opening, or of its previous answer, is closed (aiohttp's keep-alive timer runs from the connection's
  start, and a head sent a line at a time does not reset it);
- a request body, which no path here reads: drained for at most `body_timeout_seconds` after the answer,
  then the connection is closed (aiohttp's lingering time);
- its answer: one the client does not take within `write_timeout_seconds` is abandoned with its connection;
- how many are open: past `max_connections`, the open connection that has waited longest without a request
  being answered (the slowest to send its head, or the longest idle) is closed to make room; one being
  answered is never closed for another, and where all are, the newcomer is.

The probes are answered on the event loop at once; `/metrics` and `/v1/snapshot`, which take milliseconds
of rendering, on one worker thread, so the loop goes on accepting and reading heads meanwhile. Every
handler only reads the agent's cached state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpuwm.agent.core import SNAPSHOT_LIMIT_RECORDS, Agent
from gpuwm.feed import DEVICES_TAG_PARAM, SNAPSHOT_FORMATS, merge_request

log = logging.getLogger(__name__)

#: connections open at once (the controller keeps one or two, Prometheus one, the kubelet's probes one each)
MAX_CONNECTIONS = 32
#: a whole request head within this long of a connection's start or its previous answer, or it is closed
HEADER_TIMEOUT_SECONDS = 10.0
#: a request body (none is expected) is drained at most this long after the answer
BODY_TIMEOUT_SECONDS = 5.0
#: an answer not taken by the client within this long is abandoned (a snapshot is megabytes at most)
WRITE_TIMEOUT_SECONDS = 30.0
#: the listen backlog: a burst of connections is accepted (and made room for) at once, not in SYN retries
LISTEN_BACKLOG = 128
#: how often at most the server logs that it closed connections to make room
CROWDED_LOG_SECONDS = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = MAX_CONNECTIONS
    header_timeout_seconds: float = HEADER_TIMEOUT_SECONDS
    body_timeout_seconds: float = BODY_TIMEOUT_SECONDS
    write_timeout_seconds: float = WRITE_TIMEOUT_SECONDS


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


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


def _json(status: int, payload: object) -> _Answer:
    return _Answer(status, json.dumps(payload, separators=(",", ":")).encode(), "application/json")


def snapshot_answer(agent: Agent, query_string: str) -> _Answer:
    """`/v1/snapshot?since=SEQ&limit=N&format=rows|columns&merge...&devices-tag=...` (see docs/snapshot-feed.md)."""
    query = parse_qs(query_string)
    since = _non_negative(query, "since", 0)
    limit = _non_negative(query, "limit", SNAPSHOT_LIMIT_RECORDS)
    if isinstance(since, str) or isinstance(limit, str):
        return _json(400, {"error": since if isinstance(since, str) else limit})
    form = (query.get("format") or ["rows"])[-1]
    if form not in SNAPSHOT_FORMATS:
        return _json(400, {"error": f"format={form!r}: expected rows (the default) or columns"})
    try:
        merge = merge_request(query)
    except ValueError as error:
        return _json(400, {"error": str(error)})
    tags = query.get(DEVICES_TAG_PARAM)
    tag = tags[-1] if tags else None  # any text: only an equal tag leaves the devices out
    return _Answer(200, agent.snapshot_json(since, max(1, limit), form == "columns", merge, tag), "application/json")


def probe_answer(agent: Agent, path: str) -> _Answer:
    ok, reason = agent.liveness() if path == "/healthz" else agent.readiness()
    return _Answer(200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8")


def close_now(handler: web.RequestHandler) -> None:
    """Close a connection at once: what it still had to send is dropped (a plain close would wait for a
    client that does not read to take it first)."""
    if handler.transport is not None:
        handler.transport.abort()
    handler.force_close()


class _CappedServer(web.Server):
    """aiohttp's low-level server that keeps at most `max_connections` open, closing the one that has waited
    longest without a request being answered to make room for a new one."""

    def __init__(self, handler: Callable[[web.BaseRequest], Any], limits: ConnectionLimits) -> None:
        super().__init__(
            handler, keepalive_timeout=limits.header_timeout_seconds, lingering_time=limits.body_timeout_seconds,
            access_log=None,
        )
        self.limits = limits
        #: every open connection: since when it has waited for a request head, or None while one is answered
        self.waiting_since: dict[web.RequestHandler, float | None] = {}
        self.dropped_connections = 0
        self.refused_connections = 0
        self._logged_at = 0.0

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.waiting_since[handler] = time.monotonic()
        if len(self.waiting_since) > self.limits.max_connections:
            self._make_room(handler)

    def connection_lost(self, handler: web.RequestHandler, exc: BaseException | None = None) -> None:
        self.waiting_since.pop(handler, None)
        super().connection_lost(handler, exc)

    def answering(self, handler: web.RequestHandler) -> None:
        if handler in self.waiting_since:
            self.waiting_since[handler] = None

    def answered(self, handler: web.RequestHandler) -> None:
        if handler in self.waiting_since:
            self.waiting_since[handler] = time.monotonic()

    def _make_room(self, newcomer: web.RequestHandler) -> None:
        waiting = {each: since for each, since in self.waiting_since.items() if since is not None and each is not newcomer}
        if waiting:
            victim = min(waiting, key=lambda each: waiting[each])
            self.dropped_connections += 1
        else:  # every other connection has a request being answered: none of them is closed for a newcomer
            victim = newcomer
            self.refused_connections += 1
        del self.waiting_since[victim]
        close_now(victim)
        now = time.monotonic()
        if now - self._logged_at >= CROWDED_LOG_SECONDS:
            self._logged_at = now
            log.warning(
                "agent HTTP: %d connections open (the most it keeps); closed %d waiting ones, the slowest first, "
                "and refused %d while all were being answered, since started",
                self.limits.max_connections, self.dropped_connections, self.refused_connections,
            )


class AgentHTTPServer:
    """The agent's HTTP server on `address`; `serve_forever` runs it (on its own thread: `serve_in_thread`)
    until `shutdown`. `render_metrics` writes the `/metrics` body."""

    def __init__(
        self,
        address: tuple[str, int],
        agent: Agent,
        render_metrics: Callable[[], bytes],
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.agent = agent
        self.render_metrics = render_metrics
        self.limits = limits or ConnectionLimits()
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # bound now: a port in use is an OSError here, before any thread starts
        self._socket = socket.create_server(address, family=family, backlog=LISTEN_BACKLOG)
        self.server_address: tuple[str, int] = self._socket.getsockname()[:2]
        self._server: _CappedServer | None = None
        self._renderer: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    @property
    def dropped_connections(self) -> int:
        """Connections closed to make room for newer ones (waiting ones, the slowest first)."""
        return self._server.dropped_connections if self._server is not None else 0

    @property
    def refused_connections(self) -> int:
        """New connections closed at once because every open one had a request being answered."""
        return self._server.refused_connections if self._server is not None else 0

    @property
    def open_connections(self) -> int:
        return len(self._server.waiting_since) if self._server is not None else 0

    def serve_forever(self) -> None:
        """Serve until `shutdown()`."""
        self._stopped.clear()
        try:
            asyncio.run(self._serve())
        finally:
            self._stopped.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stopping.is_set():  # shut down before the loop was there to be told
            return
        self._server = _CappedServer(self._handle, self.limits)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuwm-agent-render") as renderer:
            self._renderer = renderer
            listener = await self._loop.create_server(self._server, sock=self._socket)
            try:
                await self._stop.wait()
            finally:
                listener.close()
                self._server.pre_shutdown()
                await self._server.shutdown(timeout=1.0)
                await listener.wait_closed()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        server, handler = self._server, request.protocol
        assert server is not None
        server.answering(handler)
        try:
            answer = await self._answer(request)
            response = web.Response(
                status=answer.status, body=answer.body, headers={"Content-Type": answer.content_type, **dict(answer.headers)}
            )
            try:
                async with asyncio.timeout(self.limits.write_timeout_seconds):
                    await response.prepare(request)
                    await response.write_eof()
            except TimeoutError:
                # the client does not take its answer: closed, aiohttp ends the request as a disconnection
                close_now(handler)
            return response
        finally:
            server.answered(handler)

    async def _answer(self, request: web.BaseRequest) -> _Answer:
        if request.method not in ("GET", "HEAD"):
            refused = _json(405, {"error": f"{request.method} not allowed; GET or HEAD"})
            return _Answer(refused.status, refused.body, refused.content_type, (("Allow", "GET, HEAD"),))
        path = request.path
        if path in ("/healthz", "/readyz"):
            return probe_answer(self.agent, path)
        if path == "/metrics":
            render = self._metrics_answer
        elif path == "/v1/snapshot":
            render = functools.partial(snapshot_answer, self.agent, request.query_string)
        else:
            return _json(404, {"error": f"{path} not found; try /metrics, /v1/snapshot, /healthz, /readyz"})
        return await asyncio.get_running_loop().run_in_executor(self._renderer, render)

    def _metrics_answer(self) -> _Answer:
        return _Answer(200, self.render_metrics(), CONTENT_TYPE_LATEST)

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait until it has returned (at once where it never ran)."""
        self._stopping.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed already
                loop.call_soon_threadsafe(stop.set)
        self._stopped.wait()

    def server_close(self) -> None:
        self._socket.close()


def serve_in_thread(server: AgentHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="gpuwm-agent-http", daemon=True)
    thread.start()
    return thread
