"""A minimal Kubernetes API for TokenReview and SubjectAccessReview over real HTTP (loopback only).

It answers like the real API server: authentication.k8s.io/v1 TokenReview status with
`authenticated` and `user`, authorization.k8s.io/v1 SubjectAccessReview status with
`allowed`; anything else is 404. It counts requests so tests can see the cache work.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from aiohttp import web


class FakeAuthz:
    def __init__(
        self, tokens: dict[str, str], grants: set[tuple[str, str | None]], caller_token: str
    ) -> None:
        """tokens: bearer -> username; grants: (username, namespace or None for cluster-wide)."""
        self.tokens = tokens
        self.grants = grants
        self.caller_token = caller_token
        self.requests: Counter[str] = Counter()
        self.reviews: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    def _check_caller(self, request: web.Request) -> None:
        if request.headers.get("Authorization") != f"Bearer {self.caller_token}":
            raise web.HTTPUnauthorized(text='{"kind":"Status","code":401}', content_type="application/json")

    async def token_review(self, request: web.Request) -> web.Response:
        self._check_caller(request)
        self.requests["tokenreviews"] += 1
        body = await request.json()
        assert body["kind"] == "TokenReview" and body["apiVersion"] == "authentication.k8s.io/v1"
        user = self.tokens.get(body["spec"]["token"])
        status: dict[str, Any] = {"authenticated": user is not None}
        if user is not None:
            status["user"] = {"username": user, "uid": f"uid-{user}", "groups": ["system:authenticated"]}
        return web.json_response({**body, "status": status}, status=201)

    async def access_review(self, request: web.Request) -> web.Response:
        self._check_caller(request)
        self.requests["subjectaccessreviews"] += 1
        body = await request.json()
        assert body["kind"] == "SubjectAccessReview"
        spec = body["spec"]
        attributes = spec["resourceAttributes"]
        self.reviews.append(spec)
        allowed = attributes == {
            "verb": "get",
            "group": "gpuwm.io",
            "resource": "gpuworkloadmetrics",
            **({"namespace": attributes["namespace"]} if "namespace" in attributes else {}),
        } and (
            (spec["user"], None) in self.grants or (spec["user"], attributes.get("namespace")) in self.grants
        )
        return web.json_response({**body, "status": {"allowed": allowed}}, status=201)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self.token_review)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self.access_review)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
