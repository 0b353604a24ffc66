"""An aiohttp app served on a free loopback port for the length of a test."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(app: web.Application, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """Yields the base URL (http://127.0.0.1:PORT, https:// with `ssl_context`); the server stops when the block ends."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
    try:
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
