"""Run the emulator on 127.0.0.1 in a background thread; a small synchronous JSON client for tests."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from .server import KubernetesEmulator

if TYPE_CHECKING:
    from .tls import TestPki

T = TypeVar("T")


class EmulatorThread:
    """`with EmulatorThread(emulator) as emu: emu.url ...`; stops the server and the loop on exit."""

    def __init__(self, emulator: KubernetesEmulator, pki: TestPki | None = None) -> None:
        self.emulator = emulator
        self.pki = pki  # HTTPS with client certificates required, as a real API server is usually set up
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="kubeemu", daemon=True)

    def __enter__(self) -> EmulatorThread:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> str:
        self._thread.start()
        self.url = self.run(self._start())
        return self.url

    async def _start(self) -> str:
        self._runner = web.AppRunner(self.emulator.app(), shutdown_timeout=1.0)
        await self._runner.setup()
        context = self.pki.server_context() if self.pki is not None else None
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"{'https' if context else 'http'}://127.0.0.1:{port}"

    def run(self, coroutine: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, function: Callable[[], T]) -> T:
        """Run `function` on the emulator's loop (for direct state changes such as drop_watches)."""
        async def wrapper() -> T:
            return function()
        result: T = self.run(wrapper())
        return result

    def stop(self) -> None:
        if self._runner is not None:
            self.call(self.emulator.drop_watches)
            self.run(self._runner.cleanup())
            self._runner = None
        self.run(self._cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    @staticmethod
    async def _cancel_rest() -> None:
        """Request handlers still running (a watch, a slow fake agent) end here, not at garbage collection."""
        current = asyncio.current_task()
        rest = [task for task in asyncio.all_tasks() if task is not current]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig pointing at the emulator: plain HTTP and a dummy token, or with TLS the CA and a
        client certificate embedded as base64 data (kubeadm's admin.conf)."""
        cluster: dict[str, Any] = {"server": self.url}
        user: dict[str, Any] = {"token": "kubeemu-token"}
        if self.pki is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self.pki.ca.certificate).decode()
            user = {"client-certificate-data": base64.b64encode(self.pki.client.certificate).decode(),
                    "client-key-data": base64.b64encode(self.pki.client.key).decode()}
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "kubeemu",
            "clusters": [{"name": "kubeemu", "cluster": cluster}],
            "users": [{"name": "kubeemu", "user": user}],
            "contexts": [{"name": "kubeemu", "context": {"cluster": "kubeemu", "user": "kubeemu", "namespace": "default"}}],
        }
        path.write_text(json.dumps(config))
        return path


class KubeHttp:
    """Blocking JSON calls for test code (the thing under test uses its own client)."""

    def __init__(self, base_url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> None:
        self.base_url = base_url
        self.context = context  # for an HTTPS emulator: TestPki.client_context()
        self.token = token  # a bearer token (the review APIs check who asks)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                params: dict[str, str] | None = None) -> tuple[int, Any]:
        url = self.base_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
           params: dict[str, str] | None = None) -> Any:
        status, payload = self.request(method, path, body, content_type, params)
        if status >= 300:
            raise AssertionError(f"{method} {path}: HTTP {status}: {payload}")
        return payload

    def get(self, path: str, **params: str) -> Any:
        return self.ok("GET", path, params=params or None)

    def create(self, path: str, body: Any) -> Any:
        return self.ok("POST", path, body)

    def merge(self, path: str, body: Any) -> Any:
        return self.ok("PATCH", path, body, "application/merge-patch+json")


def grant_admin_reads(thread: EmulatorThread) -> KubeHttp:
    """Set up the API's reviewers as the chart does: gpuwm's service account (`sa-token`) may review tokens
    and access, and the user `admin` (`token-admin`, audience gpuwm) may read GPUWorkloadMetrics everywhere.
    Returns a client for adding more."""
    from .reviews import UserInfo, rbac_objects, service_account_user

    thread.emulator.reviews.tokens.update({
        "sa-token": service_account_user("gpuwm", "gpuwm-controller"),
        "token-admin": UserInfo("admin", audiences=["gpuwm"]),
    })
    http = KubeHttp(thread.url)
    rules = [{"apiGroups": ["gpuwm.io"], "resources": ["gpuworkloadmetrics"], "verbs": ["get"]}]
    for path, _, body in rbac_objects(
        {}, [{"kind": "User", "name": "admin", "apiGroup": "rbac.authorization.k8s.io"}], rules,
        reviewer={"kind": "ServiceAccount", "name": "gpuwm-controller", "namespace": "gpuwm"},
    ):
        http.create(path, body)
    return http
