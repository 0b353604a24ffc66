"""Run the API app inside an existing asyncio loop (kopf's, the demo's) or on its own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp

from gpuwm.api.tls import TlsFiles


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the loop's owner (kopf, the CLI) handles signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


#: connections served at once; more are answered 503 by uvicorn (a flood of idle connections costs
#: a bounded amount of memory)
MAX_CONNECTIONS = 512


class ApiServer:
    """Start and stop the API on HOST:PORT from async code; `port` is the bound port (useful with port 0).

    `tls`: serve HTTPS with that certificate; None: plain HTTP.
    """

    def __init__(
        self, app: ASGIApp, host: str, port: int, log_level: str = "warning", tls: TlsFiles | None = None
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            log_level=log_level,
            lifespan="off",
            access_log=False,
            ssl_certfile=tls.cert_file if tls is not None else None,
            ssl_keyfile=tls.key_file if tls is not None else None,
            limit_concurrency=MAX_CONNECTIONS,
            # X-Forwarded-For is the app's to read, from the proxies its settings name (create_app): uvicorn's
            # own default trusts it from loopback, where a port-forward or a sidecar lets anyone forge it
            proxy_headers=False,
        )
        self.scheme = "https" if tls is not None else "http"
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        for server in self._server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self._server.config.port)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(), name="gpuwm-api")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start (port in use, ...)
                raise RuntimeError("the API server stopped before it started")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._task = None

    async def wait(self) -> None:
        if self._task is not None:
            await self._task

