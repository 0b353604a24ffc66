"""AgentPuller.get over aiohttp: bodies by length and chunks on kept-alive connections, large bodies, the body
limit, timeouts, TLS, and every failure an error naming the URL."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from gpuwm.controller.pull.agents import AgentHttpError, AgentPuller

from .loopback import serving

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    """A TCP server that answers with whatever bytes `handler` writes: answers aiohttp's server would never send."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def answering(answer: bytes, close: bool = False) -> Handler:
    """Answers every request on a connection with `answer`; closes the connection after each when `close`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answer)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return handle


class Agent:
    """An agent app that notes each request's path and query and the connection it came on."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.peers: set[object] = set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.path_qs)
        self.peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        if request.query.get("chunked"):
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            for part in (b'{"a":', b" 1", b"}"):
                await response.write(part)
            await response.write_eof()
            return response
        if request.query.get("size"):
            return web.Response(body=b"x" * int(request.query["size"]))
        return web.Response(body=b'{"since": "%s"}' % request.query.get("since", "").encode())

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        return app


async def test_bodies_by_length_and_by_chunks_on_one_kept_alive_connection() -> None:
    agent = Agent()
    puller = AgentPuller(timeout_seconds=2)
    async with serving(agent.app()) as url:
        try:
            assert await puller.get(url, "/v1/snapshot?since=3") == (200, b'{"since": "3"}')
            assert await puller.get(url, "/v1/snapshot?since=4&chunked=1") == (200, b'{"a": 1}')
            assert await puller.get(url, "/v1/snapshot?since=5") == (200, b'{"since": "5"}')
            assert (await puller.get(url, "/nowhere?size=2"))[0] == 200
            assert len(agent.peers) == 1  # every answer read whole: one connection, reused
        finally:
            await puller.close()


async def test_a_path_prefix_is_kept_and_the_query_sent_as_encoded() -> None:
    agent = Agent()
    puller = AgentPuller(timeout_seconds=2)
    async with serving(agent.app()) as url:
        try:
            assert (await puller.get(f"{url}/agents/n1/", "/v1/snapshot?since=0&devices_tag=a%2Fb%20c"))[0] == 200
            assert agent.seen == ["/agents/n1/v1/snapshot?since=0&devices_tag=a%2Fb%20c"]  # not quoted twice
        finally:
            await puller.close()


async def test_a_large_body_is_read_whole_and_one_over_the_limit_is_refused_naming_the_url() -> None:
    agent = Agent()
    big = 40 * 2**20
    async with serving(agent.app()) as url:
        puller = AgentPuller(timeout_seconds=20)
        try:
            status, body = await puller.get(url, f"/v1/snapshot?size={big}")
            assert status == 200 and len(body) == big and body == b"x" * big
        finally:
            await puller.close()
        puller = AgentPuller(timeout_seconds=2, max_body_bytes=1000)
        try:
            assert await puller.get(url, "/v1/snapshot?size=1000") == (200, b"x" * 1000)
            target = "/v1/snapshot?size=1001"
            with pytest.raises(AgentHttpError, match=re.escape(f"{url}{target}: a body of 1001 bytes is over the limit")):
                await puller.get(url, target)
        finally:
            await puller.close()
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"y" * 1024 + b"\r\n0\r\n\r\n"
    async with raw_server(answering(chunked)) as url:  # no length given: counted as it comes
        puller = AgentPuller(timeout_seconds=2, max_body_bytes=1000)
        try:
            with pytest.raises(AgentHttpError, match=re.escape(f"{url}/v1/snapshot: the body is over the limit")):
                await puller.get(url, "/v1/snapshot")
        finally:
            await puller.close()


@pytest.mark.parametrize("pieces", [1, 7, 1000])
@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world", b"hello world"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n"
         b"X-Trailer: 1\r\n\r\n", b"hello world"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
    ids=["content-length", "chunked-with-trailers", "no-content"],
)
async def test_an_answer_in_any_number_of_pieces_is_read_whole(answer: bytes, body: bytes, pieces: int) -> None:
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                step = max(1, len(answer) // pieces)
                for start in range(0, len(answer), step):
                    writer.write(answer[start : start + step])
                    await writer.drain()
                    await asyncio.sleep(0.001)  # each piece its own segment, read on its own
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async with raw_server(trickle) as url:
        puller = AgentPuller(timeout_seconds=5)
        try:
            for _ in range(2):
                assert await puller.get(url, "/a") == (int(answer[9:12]), body)
        finally:
            await puller.close()


async def test_a_body_without_length_ends_with_the_connection() -> None:
    answer = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"x\": 1}"
    async with raw_server(answering(answer, close=True)) as url:
        puller = AgentPuller(timeout_seconds=2)
        try:
            for _ in range(2):  # the second on a new connection: the first ended with its body
                assert await puller.get(url, "/v1/snapshot") == (200, b'{"x": 1}')
        finally:
            await puller.close()


async def test_a_connection_the_agent_closed_while_idle_is_not_a_failure() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(answering(ok, close=True)) as url:  # closes each connection after one answer
        puller = AgentPuller(timeout_seconds=2)
        try:
            for _ in range(3):
                assert await puller.get(url, "/a") == (200, b"ok")
                await asyncio.sleep(0.05)  # the agent's close arrives while the connection is idle
        finally:
            await puller.close()


async def test_a_silent_agent_times_out_naming_the_url() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()

    async with raw_server(silent) as url:
        puller = AgentPuller(timeout_seconds=0.2)
        try:
            with pytest.raises(TimeoutError, match=re.escape(f"{url}/v1/snapshot: no whole answer within 0.2 s")):
                await puller.get(url, "/v1/snapshot")
        finally:
            await puller.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",  # cut inside the body
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",  # a length that is not a number
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # a chunk size that is not hexadecimal
        b"HTTP/1.1 200 OK\r\nContent-Len",  # cut inside the headers
    ],
    ids=["not-http", "cut-body", "bad-length", "bad-chunk", "cut-headers"],
)
async def test_a_bad_answer_is_an_error_naming_the_url(answer: bytes) -> None:
    async with raw_server(answering(answer, close=True)) as url:
        puller = AgentPuller(timeout_seconds=2)
        try:
            with pytest.raises(AgentHttpError) as raised:
                await puller.get(url, "/v1/snapshot?since=0")
            assert str(raised.value).startswith(f"{url}/v1/snapshot?since=0: ")
        finally:
            await puller.close()


async def test_unreachable_and_malformed_urls_are_named() -> None:
    puller = AgentPuller(timeout_seconds=2)
    try:
        for base in ("http://127.0.0.1:9", "ftp://agent", "http://agent:99999", "agent-without-scheme:9400"):
            with pytest.raises(AgentHttpError, match=re.escape(f"{base}/v1/snapshot: ")):
                await puller.get(base, "/v1/snapshot")
    finally:
        await puller.close()


async def test_https_agents_are_checked_against_the_given_ca(tmp_path: Path) -> None:
    from tests.integration.kubeemu.tls import make_pki

    pki, other = make_pki(tmp_path / "pki"), make_pki(tmp_path / "other")
    agent = Agent()
    async with serving(agent.app(), pki.server_context()) as url:
        trusted = AgentPuller(timeout_seconds=2, ssl_context=pki.client_context())
        stranger = AgentPuller(timeout_seconds=2, ssl_context=other.client_context())
        system = AgentPuller(timeout_seconds=2)  # the system's CAs: they did not sign the test CA
        try:
            assert await trusted.get(url, "/v1/snapshot?since=1") == (200, b'{"since": "1"}')
            for puller in (stranger, system):
                with pytest.raises(AgentHttpError, match=re.escape(f"{url}/v1/snapshot?since=1: ")):
                    await puller.get(url, "/v1/snapshot?since=1")
            assert agent.seen == ["/v1/snapshot?since=1"]
        finally:
            for puller in (trusted, stranger, system):
                await puller.close()
    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")  # what a plain server says to TLS
        await writer.drain()
        writer.close()

    async with raw_server(plain) as url:
        puller = AgentPuller(timeout_seconds=2)  # https:// to an agent that serves plain HTTP
        try:
            with pytest.raises(AgentHttpError, match=re.escape(url.replace("http://", "https://"))):
                await puller.get(url.replace("http://", "https://"), "/v1/snapshot")
        finally:
            await puller.close()
