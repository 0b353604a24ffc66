"""Headers every answer of the API carries, added by one plain ASGI middleware.

The dashboard is a page that holds a bearer token: it must not run script from anywhere but its own
files (no inline script, nothing injected through a name in the data can run), must not be framed by
another site (clickjacking), and must not send its URL (which names workloads) to any other site.
The JSON answers carry the same headers: a browser that opens one directly gets the same rules.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: only the page's own files: scripts, styles and API calls to this origin, nothing inline, no frames, no forms
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
)


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every HTTP answer of `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)
