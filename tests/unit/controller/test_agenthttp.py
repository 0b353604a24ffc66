"""AgentHttpClient: bodies by length, chunks and connection end; keep-alive; every bad answer named."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from gpuwm.controller.agenthttp import AgentHttpClient, AgentHttpError

from .loopback import serving

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    """A TCP server that answers with whatever bytes `handler` writes: answers aiohttp would never send."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def answering(*answers: bytes, close: bool = False) -> Handler:
    """Answers each request on a connection with the next of `answers`; closes after them when `close`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for answer in answers:
                await read_request(reader)
                writer.write(answer)
                await writer.drain()
            if close:
                writer.close()
            else:
                await reader.read()  # keep the connection until the client closes it
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return handle


async def test_bodies_by_length_and_by_chunks_on_one_kept_alive_connection() -> None:
    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("chunked"):
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            for part in (b'{"a":', b" 1", b"}"):
                await response.write(part)
            await response.write_eof()
            return response
        return web.Response(body=b'{"since": "%s"}' % request.query["since"].encode())

    app = web.Application()
    app.router.add_get("/v1/snapshot", handle)
    client = AgentHttpClient(timeout_seconds=2)
    async with serving(app) as url:
        try:
            assert await client.get(url, "/v1/snapshot?since=3") == (200, b'{"since": "3"}')
            assert await client.get(url, "/v1/snapshot?since=4&chunked=1") == (200, b'{"a": 1}')
            assert await client.get(url, "/v1/snapshot?since=5") == (200, b'{"since": "5"}')
            assert await client.get(url, "/nowhere") == (404, b"404: Not Found")
            assert client.connections_opened == 1
        finally:
            await client.close()


async def test_a_body_without_length_ends_with_the_connection() -> None:
    async with raw_server(answering(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"x\": 1}", close=True)) as url:
        client = AgentHttpClient(timeout_seconds=2)
        assert await client.get(url, "/v1/snapshot") == (200, b'{"x": 1}')
        assert client._idle.get(("http", "127.0.0.1", int(url.rsplit(":", 1)[1]))) in (None, [])
        await client.close()


async def test_connection_close_is_honoured_and_an_idle_close_is_retried_once() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(answering(ok, close=True)) as url:  # closes each connection after one answer
        client = AgentHttpClient(timeout_seconds=2)
        assert await client.get(url, "/a") == (200, b"ok")
        await asyncio.sleep(0.05)  # the server's close arrives while the connection is idle
        assert await client.get(url, "/b") == (200, b"ok")
        assert client.connections_opened == 2
        await client.close()
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(answering(closing, closing)) as url:
        client = AgentHttpClient(timeout_seconds=2)
        for _ in range(2):
            assert await client.get(url, "/a") == (200, b"ok")
        assert client.connections_opened == 2  # "Connection: close" is never reused
        await client.close()


async def test_idle_connections_expire() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(answering(ok, ok)) as url:
        now = [time.monotonic()]
        client = AgentHttpClient(timeout_seconds=2, keepalive_seconds=60, clock=lambda: now[0])
        await client.get(url, "/a")
        now[0] += 61
        await client.get(url, "/a")
        assert client.connections_opened == 2
        assert client.prune_idle() == 0 and len(client._idle) == 1  # the second is fresh
        now[0] += 61  # its agent is never asked again (a node scaled away): pruning closes it
        assert client.prune_idle() == 1 and client._idle == {}
        await client.close()


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nxx", "gzip-encoded"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "Content-Length 'ten'"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "inside the answer's body"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000, "over the limit of 1000"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not hexadecimal"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n", "does not end with CRLF"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "without a colon"),
        (b"HTTP/1.1 200 OK\r\nContent-Len", "inside the answer's headers"),
    ],
)
async def test_a_bad_answer_is_an_error_naming_the_url_and_the_connection_is_dropped(answer: bytes, message: str) -> None:
    async with raw_server(answering(answer, close=True)) as url:
        client = AgentHttpClient(timeout_seconds=2, max_body_bytes=1000)
        with pytest.raises(AgentHttpError, match=message) as raised:
            await client.get(url, "/v1/snapshot?since=0")
        assert f"{url}/v1/snapshot?since=0" in str(raised.value)
        assert not any(client._idle.values())
        await client.close()


async def test_a_silent_agent_times_out_and_its_connection_is_not_reused() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()

    async with raw_server(silent) as url:
        client = AgentHttpClient(timeout_seconds=0.2)
        with pytest.raises(TimeoutError):
            await client.get(url, "/v1/snapshot")
        assert not any(client._idle.values())
        await client.close()


async def test_unreachable_and_malformed_urls_are_named() -> None:
    client = AgentHttpClient(timeout_seconds=2)
    with pytest.raises(AgentHttpError, match=re.escape("http://127.0.0.1:9/v1/snapshot: cannot connect")):
        await client.get("http://127.0.0.1:9", "/v1/snapshot")
    with pytest.raises(AgentHttpError, match="expected an http:// or https:// URL"):
        await client.get("ftp://agent", "/v1/snapshot")
    with pytest.raises(AgentHttpError, match="agent:99999"):
        await client.get("http://agent:99999", "/v1/snapshot")

    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")  # what a plain server says to TLS
        await writer.drain()
        writer.close()

    async with raw_server(plain) as url:  # https:// to an agent that serves plain HTTP
        with pytest.raises(AgentHttpError, match="cannot connect"):
            await client.get(url.replace("http://", "https://"), "/v1/snapshot")
    await client.close()


def recording(seen: list[bytes], answer: bytes, first_line_only: bool = False) -> Handler:
    """Answers every request on a connection with `answer`, noting each (its head and body, or its first line)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await read_request(reader)
                if first_line_only:
                    seen.append(head.split(b"\r\n", 1)[0])
                else:
                    length = re.search(rb"Content-Length: (\d+)", head)
                    seen.append(head + (await reader.readexactly(int(length.group(1))) if length else b""))
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle


async def test_a_path_prefix_is_kept_and_nothing_is_kept_per_request() -> None:
    lines: list[bytes] = []
    async with raw_server(recording(lines, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True)) as url:
        client = AgentHttpClient(timeout_seconds=2)
        for since in range(200):  # every pull asks from another `since`
            assert await client.get(f"{url}/agents/n1/", f"/v1/snapshot?since={since}") == (200, b"ok")
        assert lines[0] == b"GET /agents/n1/v1/snapshot?since=0 HTTP/1.1" and len(lines) == 200
        assert len(client._origins) == 1 and client.connections_opened == 1  # one parsed origin, one connection
        await client.close()


async def test_header_names_and_values_are_read_without_regard_to_case() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    async with raw_server(answering(chunked, chunked)) as url:
        client = AgentHttpClient(timeout_seconds=2)
        for _ in range(2):
            assert await client.get(url, "/a") == (200, b"ok")
        assert client.connections_opened == 1  # a whole chunked body: the connection is kept
        await client.close()


async def test_a_request_with_a_body_sends_its_length_and_headers_and_refuses_a_split_header() -> None:
    seen: list[bytes] = []
    async with raw_server(recording(seen, b"HTTP/1.1 429 Too Many\r\nRetry-After: 3\r\nContent-Length: 2\r\n\r\n{}")) as url:
        client = AgentHttpClient(timeout_seconds=2)
        status, headers, body = await client.request("PATCH", url, "/x/status?fieldManager=gpuwm", b'{"a":1}',
                                                     {"Authorization": "Bearer t", "Content-Type": "application/json"})
        assert (status, headers["retry-after"], body) == (429, "3", b"{}")
        assert seen[0].startswith(b"PATCH /x/status?fieldManager=gpuwm HTTP/1.1\r\n")
        assert b"\r\nAuthorization: Bearer t\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"a":1}')
        for bad in ({"Authorization": "Bearer t\r\nX-Evil: 1"}, {"X-Evil:": "1"}):
            with pytest.raises(AgentHttpError, match="line break or a colon"):
                await client.request("PATCH", url, "/x", b"{}", bad)
        assert len(seen) == 1  # nothing of a refused request was sent
        await client.close()


def trickling(answer: bytes, pieces: int) -> Handler:
    """Answers each request with `answer` cut into `pieces` writes, each sent on its own."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                step = max(1, len(answer) // pieces)
                for start in range(0, len(answer), step):
                    writer.write(answer[start : start + step])
                    await writer.drain()
                    await asyncio.sleep(0.001)  # each piece its own segment, read on its own
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle


@pytest.mark.parametrize("pieces", [1, 7, 1000])
@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world", b"hello world"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n"
         b"X-Trailer: 1\r\nY-Trailer: 2\r\n\r\n", b"hello world"),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", b""),
    ],
    ids=["content-length", "chunked-with-trailers", "no-content"],
)
async def test_an_answer_in_any_number_of_pieces_is_read_whole_and_the_connection_kept(
    answer: bytes, body: bytes, pieces: int,
) -> None:
    async with raw_server(trickling(answer, pieces)) as url:
        client = AgentHttpClient(timeout_seconds=5)
        for _ in range(2):
            status, got = await client.get(url, "/a")
            assert (status, got) == (int(answer[9:12]), body)
        assert client.connections_opened == 1  # each answer ended where its framing said: the connection is reused
        await client.close()


async def test_bytes_after_an_answer_leave_its_connection_unused_and_headers_past_the_limit_are_refused() -> None:
    extra = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"  # more than was asked for
    async with raw_server(answering(extra, extra)) as url:
        client = AgentHttpClient(timeout_seconds=2)
        for _ in range(2):
            assert await client.get(url, "/a") == (200, b"ok")
        assert client.connections_opened == 2  # what came after the answer is nobody's: never reused
        await client.close()
    huge = b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"x" * (70 * 1024) + b"\r\n\r\n"
    async with raw_server(answering(huge)) as url:
        client = AgentHttpClient(timeout_seconds=2)
        with pytest.raises(AgentHttpError, match="headers are over 65536 bytes"):
            await client.get(url, "/a")
        assert not any(client._idle.values())
        await client.close()


async def test_a_connection_the_agent_closed_while_idle_is_not_taken_again() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(answering(ok, close=True)) as url:
        client = AgentHttpClient(timeout_seconds=2)
        assert await client.get(url, "/a") == (200, b"ok")
        await asyncio.sleep(0.05)
        assert client.prune_idle() == 1 and client._idle == {}  # its agent closed it: pruned, not kept
        await client.close()
