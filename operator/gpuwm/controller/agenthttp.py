"""A lean HTTP/1.1 client for the agents' `/v1/snapshot` pulls (and the controller's status writes).

A 1,000-node cluster is 1,000 agent requests every status interval. aiohttp's client spent
~0.2-0.3 ms of CPU on each in its own layers (request and response objects, yarl URLs,
tracing hooks, timer handles, a task per payload write): a third of the pull phase, more
than parsing the snapshots. This client does only what a pull needs: GET, one kept-alive
connection per agent (more only while requests overlap), the body by Content-Length, by
chunks or up to the connection's end, http:// and https://, one deadline per request.

Anything unexpected (a status line that is not HTTP/1.x, a body compressed although none
was asked for, a body over `max_body_bytes`, a connection that closes mid-answer) raises
`AgentHttpError` naming the URL; the connection is then closed, never reused. A kept-alive
connection that the agent closed while idle is retried once on a new one, as browsers
and aiohttp do for an idempotent GET.

`request` sends other methods with a body and headers the same way: what the controller's
status writes use (`KubeClient`, a JSON merge patch of `/status`, ~0.13 ms less CPU each than
through aiohttp at 20 writes a second). A kept connection that closed while idle is tried
again once there too: a merge patch of a status is the same patch however often it lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

#: the largest body read from one agent: a page of the agent's feed is at most a few MB
MAX_BODY_BYTES = 256 * 2**20
#: the largest status line and header block accepted
MAX_HEAD_BYTES = 64 * 2**10
#: base URLs kept parsed (one per agent)
MAX_ORIGINS_KEPT = 20_000


class AgentHttpError(Exception):
    """A request to an agent that failed; the message names the URL and what went wrong."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True, slots=True)
class _Origin:
    """What a base URL says once parsed: (scheme, host, port), the Host header, a path prefix."""

    key: tuple[str, str, int]
    host_header: str
    path_prefix: str


class AgentHttpClient:
    """GET over kept-alive HTTP/1.1 connections; see the module docstring."""

    def __init__(
        self,
        timeout_seconds: float,
        keepalive_seconds: float = 60.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        clock: Callable[[], float] = time.monotonic,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._timeout_seconds = timeout_seconds
        self._keepalive_seconds = keepalive_seconds
        self._max_body_bytes = max_body_bytes
        self._clock = clock
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._origins: dict[str, _Origin] = {}
        self._ssl: ssl.SSLContext | None = ssl_context  # https: the system's CA bundle when None
        #: connections opened (for tests and the benchmark: kept-alive connections are reused)
        self.connections_opened = 0

    async def get(self, base_url: str, target: str = "/") -> tuple[int, bytes]:
        """(status, body) of GET `base_url` + `target` (a path and query); raises AgentHttpError or TimeoutError.

        `base_url` (scheme, host, port and any path prefix) is parsed once and kept; `target`
        changes from one request to the next (`?since=SEQ`) and is never kept.
        """
        origin = self._origin(base_url)
        request = (
            f"GET {origin.path_prefix}{target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"
            "Accept: application/json\r\nAccept-Encoding: identity\r\nUser-Agent: gpuwm-controller\r\n\r\n"
        ).encode("latin-1")
        status, _, body = await self._send(origin, base_url + target, request)
        return status, body

    async def request(
        self, method: str, base_url: str, target: str, body: bytes = b"", headers: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, lower-cased headers, body) of `method` `base_url` + `target` with `body` and `headers`.

        `headers` may not hold a line break (AgentHttpError): a header is never split into two.
        Raises AgentHttpError or TimeoutError as `get` does.
        """
        origin = self._origin(base_url)
        lines = [f"{method} {origin.path_prefix}{target} HTTP/1.1", f"Host: {origin.host_header}",
                 "Accept: application/json", "Accept-Encoding: identity", f"Content-Length: {len(body)}"]
        for name, value in (headers or {}).items():
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
                raise AgentHttpError(f"{base_url}: header {name!r} holds a line break or a colon in its name")
            lines.append(f"{name}: {value}")
        try:
            request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        except UnicodeEncodeError as error:
            raise AgentHttpError(f"{base_url}: a header or the target is not Latin-1: {error}") from None
        return await self._send(origin, base_url + target, request)

    async def _send(self, origin: _Origin, url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
        key = origin.key
        async with asyncio.timeout(self._timeout_seconds):
            connection = self._take_idle(key)
            if connection is not None:
                try:
                    return await self._exchange(key, connection, request, url)
                except _StaleConnection:
                    pass  # the agent closed it while it was idle: once more on a new connection
            connection = await self._open(origin, url)
            try:
                return await self._exchange(key, connection, request, url)
            except _StaleConnection as error:
                raise AgentHttpError(f"{url}: the connection closed before an answer") from error

    def prune_idle(self) -> int:
        """Close idle connections past the keep-alive time or closed by their agent; how many were closed.

        A connection is otherwise looked at only when its agent is asked again: one to an agent
        that is gone (a node scaled away) would stay open, a socket and a file descriptor each.
        """
        now, closed = self._clock(), 0
        for key in list(self._idle):
            kept = []
            for connection in self._idle[key]:
                if self._reusable(connection, now):
                    kept.append(connection)
                else:
                    connection.close()
                    closed += 1
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        return closed

    async def close(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        for connections in idle.values():
            for connection in connections:
                with contextlib.suppress(Exception):
                    await connection.writer.wait_closed()

    # ------------------------------------------------------------------ inside

    def _origin(self, base_url: str) -> _Origin:
        origin = self._origins.get(base_url)
        if origin is not None:
            return origin
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise AgentHttpError(f"{base_url}: expected an http:// or https:// URL with a host (and no query)")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as error:
            raise AgentHttpError(f"{base_url}: {error}") from error
        origin = _Origin((parts.scheme, parts.hostname, port), parts.netloc.rpartition("@")[2], parts.path.rstrip("/"))
        if len(self._origins) >= MAX_ORIGINS_KEPT:  # agents come and go: a cache, not a record
            self._origins.clear()
        self._origins[base_url] = origin
        return origin

    def _reusable(self, connection: _Connection, now: float) -> bool:
        """Idle for less than the keep-alive time, and not closed by its agent."""
        return now - connection.idle_since < self._keepalive_seconds and not connection.reader.at_eof()

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        connections = self._idle.get(key)
        now = self._clock()
        while connections:
            connection = connections.pop()
            if self._reusable(connection, now):
                return connection
            connection.close()
        return None

    async def _open(self, origin: _Origin, url: str) -> _Connection:
        scheme, host, port = origin.key
        context: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, limit=MAX_HEAD_BYTES, server_hostname=host if context is not None else None,
            )
        except OSError as error:
            raise AgentHttpError(f"{url}: cannot connect: {error}") from error
        self.connections_opened += 1
        return _Connection(reader, writer, self._clock())

    async def _exchange(
        self, key: tuple[str, str, int], connection: _Connection, request: bytes, url: str
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on `connection`; returns it to the idle pool only after a whole, reusable answer."""
        reusable = False
        answered = False
        try:
            connection.writer.write(request)
            try:
                head = await connection.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as error:
                if not error.partial:  # nothing came back at all: closed while idle (or refused)
                    raise _StaleConnection from error
                raise AgentHttpError(f"{url}: the connection closed inside the answer's headers") from error
            except ConnectionError as error:
                raise _StaleConnection from error
            answered = True
            status, headers, keep_alive = _parse_head(head, url)
            if status in (204, 304):  # no body, whatever the headers say
                reusable = keep_alive
                return status, headers, b""
            body = await self._body(connection.reader, headers, url)
            # a body that ended with the connection leaves nothing to reuse
            reusable = keep_alive and ("content-length" in headers or _chunked(headers))
            return status, headers, body
        except asyncio.LimitOverrunError as error:
            raise AgentHttpError(f"{url}: the answer's headers are over {MAX_HEAD_BYTES} bytes") from error
        except asyncio.IncompleteReadError as error:
            raise AgentHttpError(f"{url}: the connection closed inside the answer's body") from error
        except ConnectionError as error:
            if not answered:
                raise _StaleConnection from error
            raise AgentHttpError(f"{url}: {error!r}") from error
        finally:
            if reusable:
                connection.idle_since = self._clock()
                self._idle.setdefault(key, []).append(connection)
            else:
                connection.close()

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str], url: str) -> bytes:
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise AgentHttpError(f"{url}: the answer is {encoding}-encoded; none was asked for")
        if _chunked(headers):
            return await self._chunked(reader, url)
        length_text = headers.get("content-length")
        if length_text is not None:
            if not length_text.strip().isdigit():
                raise AgentHttpError(f"{url}: Content-Length {length_text!r} is not a number")
            length = int(length_text)
            if length > self._max_body_bytes:
                raise AgentHttpError(f"{url}: a body of {length} bytes is over the limit of {self._max_body_bytes}")
            return await reader.readexactly(length)
        body = await reader.read(self._max_body_bytes + 1)  # no length: the body ends with the connection
        while not reader.at_eof() and len(body) <= self._max_body_bytes:
            more = await reader.read(self._max_body_bytes + 1 - len(body))
            if not more:
                break
            body += more
        if len(body) > self._max_body_bytes:
            raise AgentHttpError(f"{url}: the body is over the limit of {self._max_body_bytes} bytes")
        return body

    async def _chunked(self, reader: asyncio.StreamReader, url: str) -> bytes:
        parts: list[bytes] = []
        size_total = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as error:
                raise AgentHttpError(f"{url}: a chunk size {size_text!r} is not hexadecimal") from error
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any, up to the empty line
                    pass
                return b"".join(parts)
            size_total += size
            if size_total > self._max_body_bytes:
                raise AgentHttpError(f"{url}: the body is over the limit of {self._max_body_bytes} bytes")
            parts.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise AgentHttpError(f"{url}: a chunk does not end with CRLF")


def _chunked(headers: dict[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


class _StaleConnection(Exception):
    """The connection closed before any of the answer came: safe to send the GET again."""


def _parse_head(head: bytes, url: str) -> tuple[int, dict[str, str], bool]:
    """(status, lower-cased headers, whether the connection stays open) of a response head."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    status_text = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or not status_text.isdigit():
        raise AgentHttpError(f"{url}: not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise AgentHttpError(f"{url}: a header line without a colon: {line[:80]!r}")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return int(status_text), headers, keep_alive
