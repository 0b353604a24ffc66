"""A lean HTTP/1.1 client for the agents' `/v1/snapshot` pulls (and the controller's status writes).

A 1,000-node cluster is 1,000 agent requests every status interval. aiohttp's client spent
~0.2-0.3 ms of CPU on each in its own layers (request and response objects, yarl URLs,
tracing hooks, timer handles, a task per payload write): a third of the pull phase, more
than parsing the snapshots. This client does only what a pull needs: GET, one kept-alive
connection per agent (more only while requests overlap), the body by Content-Length, by
chunks or up to the connection's end, http:// and https://, one deadline per request.
Each connection's answers are read by a protocol (`_AnswerReader`) as the bytes arrive, not
through a stream reader: per request one future and one timer, where `readuntil`/`readexactly`
under `asyncio.timeout` woke the task per read and built a timeout context (a 1,000-agent
pull: 0.132-0.141 CPU-s against 0.145-0.151, bench/README.md). Bytes that come after an answer
leave its connection unused: a stream reader kept them and read them as the next answer's head.

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
from typing import cast
from urllib.parse import urlsplit

#: the largest body read from one agent: a page of the agent's feed is at most a few MB
MAX_BODY_BYTES = 256 * 2**20
#: the largest status line and header block accepted
MAX_HEAD_BYTES = 64 * 2**10
#: base URLs kept parsed (one per agent)
MAX_ORIGINS_KEPT = 20_000


class AgentHttpError(Exception):
    """A request to an agent that failed; the message names the URL and what went wrong."""


#: (status, lower-cased headers, body, whether the connection can carry another request)
_Answer = tuple[int, dict[str, str], bytes, bool]
#: how an answer's body ends besides a Content-Length (a length is the body mode itself, >= 0)
_NO_BODY, _CHUNKED, _UNTIL_CLOSED = -1, -2, -3


@dataclass
class _Connection:
    reader: _AnswerReader
    idle_since: float

    def close(self) -> None:
        self.reader.close()


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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_seconds
        connection = self._take_idle(key)
        if connection is not None:
            try:
                return await self._exchange(key, connection, request, url, deadline)
            except _StaleConnection:
                pass  # the agent closed it while it was idle: once more on a new connection
        async with asyncio.timeout_at(deadline):  # a new connection: rare with keep-alive, the plain way
            connection = await self._open(origin, url)
        try:
            return await self._exchange(key, connection, request, url, deadline)
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
                    await connection.reader.closed

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
        return now - connection.idle_since < self._keepalive_seconds and connection.reader.reusable()

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
        max_body_bytes = self._max_body_bytes
        try:
            _, reader = await asyncio.get_running_loop().create_connection(
                lambda: _AnswerReader(max_body_bytes), host, port, ssl=context,
                server_hostname=host if context is not None else None,
            )
        except OSError as error:
            raise AgentHttpError(f"{url}: cannot connect: {error}") from error
        self.connections_opened += 1
        return _Connection(reader, self._clock())

    async def _exchange(
        self, key: tuple[str, str, int], connection: _Connection, request: bytes, url: str, deadline: float,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on `connection`; returns it to the idle pool only after a whole, reusable answer."""
        reader = connection.reader
        reusable = False
        answer = reader.expect(url)
        timer = asyncio.get_running_loop().call_at(deadline, _expire, answer)
        try:
            if not answer.done() and reader.transport is not None:  # done already: closed while idle
                reader.transport.write(request)
            status, headers, body, reusable = await answer
            return status, headers, body
        finally:
            timer.cancel()
            if reusable and reader.reusable():
                connection.idle_since = self._clock()
                self._idle.setdefault(key, []).append(connection)
            else:
                reader.forget()
                connection.close()


def _expire(answer: asyncio.Future[_Answer]) -> None:
    """The request's deadline passed before its whole answer came."""
    if not answer.done():
        answer.set_exception(TimeoutError())


class _AnswerReader(asyncio.Protocol):
    """One connection's answers, read as their bytes arrive (see the module docstring).

    `expect` arms it for the next answer; the answer's future is completed once its head and
    whole body are in: by Content-Length, by chunks, or at the connection's end. A bad answer
    fails the future with `AgentHttpError` (the client then closes the connection); a
    connection that closed before any byte of the answer fails it with `_StaleConnection`.
    """

    def __init__(self, max_body_bytes: int) -> None:
        self._max_body_bytes = max_body_bytes
        self.transport: asyncio.Transport | None = None
        self.lost = False  # the agent closed its side, or the connection failed
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buffer = bytearray()
        self._answer: asyncio.Future[_Answer] | None = None
        self._url = ""
        #: the head of the answer being read: status, headers, keep-alive, body mode, where the body starts
        self._head: tuple[int, dict[str, str], bool, int, int] | None = None
        self._position = 0  # chunked bodies: where the next chunk (or trailer line) starts
        self._chunks: list[bytes] = []
        self._chunk_bytes = 0
        self._trailers = False  # the last chunk came: trailer lines up to the empty one

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._answer is not None:
            self._advance()
        elif len(self._buffer) > MAX_HEAD_BYTES:  # many bytes no request asked for: the connection is done
            self.close()

    def eof_received(self) -> bool:
        self.lost = True
        self._advance()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._advance()
        if not self.closed.done():
            self.closed.set_result(None)

    # -- the client's side

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def reusable(self) -> bool:
        """Open, and holding no bytes that no request asked for."""
        transport = self.transport
        return not self.lost and not self._buffer and transport is not None and not transport.is_closing()

    def expect(self, url: str) -> asyncio.Future[_Answer]:
        """Armed for the answer to the request about to be sent on this connection."""
        self._url = url
        self._head = None
        self._position, self._chunks, self._chunk_bytes, self._trailers = 0, [], 0, False
        answer = self._answer = asyncio.get_running_loop().create_future()
        if self.transport is not None and self.transport.is_closing():  # closed on our side: no answer will come
            self.lost = True
        if self._buffer or self.lost:
            self._advance()
        return answer

    def forget(self) -> None:
        """The request ended without its answer (a deadline, a cancellation): nothing more is read for it."""
        self._answer = None

    # -- reading an answer

    def _advance(self) -> None:
        answer = self._answer
        if answer is None:
            return
        if answer.done():  # its deadline passed, or its caller was cancelled
            self._answer = None
            return
        try:
            result = self._complete()
            if result is None and self.lost:  # closed before the answer was whole
                if self._head is None and not self._buffer:
                    raise _StaleConnection()
                where = "headers" if self._head is None else "body"
                raise AgentHttpError(f"{self._url}: the connection closed inside the answer's {where}")
        except (AgentHttpError, _StaleConnection) as failure:
            self._answer = None
            answer.set_exception(failure)
            self.close()
            return
        if result is not None:
            self._answer = None
            answer.set_result(result)

    def _complete(self) -> _Answer | None:
        """The whole answer, taken out of the buffer, once it is all there; else None. Raises for a bad one."""
        buffer, url = self._buffer, self._url
        head = self._head
        if head is None:
            end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES)
            if end < 0:
                if len(buffer) >= MAX_HEAD_BYTES:
                    raise AgentHttpError(f"{url}: the answer's headers are over {MAX_HEAD_BYTES} bytes")
                return None
            status, headers, keep_alive = _parse_head(bytes(buffer[:end]), url)
            head = self._head = (status, headers, keep_alive, _body_mode(status, headers, url, self._max_body_bytes),
                                 end + 4)
            self._position = end + 4
        status, headers, keep_alive, mode, start = head
        if mode >= 0:  # Content-Length
            end = start + mode
            if len(buffer) < end:
                return None
            body = bytes(buffer[start:end])
            del buffer[:end]
            return status, headers, body, keep_alive
        if mode == _NO_BODY:
            del buffer[:start]
            return status, headers, b"", keep_alive
        if mode == _CHUNKED:
            chunked = self._chunked_body()
            if chunked is None:
                return None
            del buffer[: self._position]
            return status, headers, chunked, keep_alive
        if len(buffer) - start > self._max_body_bytes:  # _UNTIL_CLOSED
            raise AgentHttpError(f"{url}: the body is over the limit of {self._max_body_bytes} bytes")
        if not self.lost:
            return None
        body = bytes(buffer[start:])
        buffer.clear()
        return status, headers, body, False  # a body that ended with the connection leaves nothing to reuse

    def _chunked_body(self) -> bytes | None:
        """The chunks joined once the last one and the trailers are in; None until then."""
        buffer, url = self._buffer, self._url
        while True:
            position = self._position
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                if len(buffer) - position > MAX_HEAD_BYTES:
                    raise AgentHttpError(f"{url}: a chunk size or trailer line is over {MAX_HEAD_BYTES} bytes")
                return None
            if self._trailers:
                self._position = line_end + 2
                if line_end == position:  # the empty line: the body is whole
                    return b"".join(self._chunks)
                continue
            size_text = bytes(buffer[position:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise AgentHttpError(f"{url}: a chunk size {size_text!r} is not hexadecimal") from None
            if size == 0:
                self._trailers = True
                self._position = line_end + 2
                continue
            if self._chunk_bytes + size > self._max_body_bytes:
                raise AgentHttpError(f"{url}: the body is over the limit of {self._max_body_bytes} bytes")
            data_end = line_end + 2 + size
            if len(buffer) < data_end + 2:
                return None
            if buffer[data_end : data_end + 2] != b"\r\n":
                raise AgentHttpError(f"{url}: a chunk does not end with CRLF")
            self._chunks.append(bytes(buffer[line_end + 2 : data_end]))
            self._chunk_bytes += size
            self._position = data_end + 2


def _body_mode(status: int, headers: dict[str, str], url: str, max_body_bytes: int) -> int:
    """How the answer's body ends: its Content-Length (>= 0), `_NO_BODY`, `_CHUNKED` or `_UNTIL_CLOSED`."""
    if status in (204, 304):  # no body, whatever the headers say
        return _NO_BODY
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AgentHttpError(f"{url}: the answer is {encoding}-encoded; none was asked for")
    if _chunked(headers):
        return _CHUNKED
    length_text = headers.get("content-length")
    if length_text is None:
        return _UNTIL_CLOSED
    if not length_text.strip().isdigit():
        raise AgentHttpError(f"{url}: Content-Length {length_text!r} is not a number")
    length = int(length_text)
    if length > max_body_bytes:
        raise AgentHttpError(f"{url}: a body of {length} bytes is over the limit of {max_body_bytes}")
    return length


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
