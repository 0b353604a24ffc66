"""The agent's HTTP server: `/metrics`, `/v1/snapshot`, `/healthz`, `/readyz`.

The standard library's threading server keeps the agent small (no event loop, no framework);
every handler only reads the agent's cached state.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gpuwm.agent.core import Agent

log = logging.getLogger(__name__)


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[v6]:PORT`) -> (host, port); raises ValueError naming the option."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT such as 0.0.0.0:9400")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Handler(BaseHTTPRequestHandler):
    server: AgentHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: object) -> None:
        self._send(status, json.dumps(payload, separators=(",", ":")).encode(), "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        agent = self.server.agent
        try:
            if url.path == "/metrics":
                self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
            elif url.path == "/v1/snapshot":
                values = parse_qs(url.query).get("since", ["0"])
                try:
                    since = int(values[-1])
                    if since < 0:
                        raise ValueError
                except ValueError:
                    self._json(400, {"error": f"since={values[-1]!r}: expected a sequence number >= 0"})
                    return
                self._json(200, agent.snapshot(since))
            elif url.path in ("/healthz", "/readyz"):
                ok, reason = agent.liveness() if url.path == "/healthz" else agent.readiness()
                self._send(200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._json(404, {"error": f"{url.path} not found; try /metrics, /v1/snapshot, /healthz, /readyz"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away


class AgentHTTPServer(ThreadingHTTPServer):
    """Threaded HTTP server bound to one agent."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], agent: Agent, registry: CollectorRegistry) -> None:
        self.agent = agent
        self.registry = registry
        super().__init__(address, _Handler)


def serve_in_thread(server: AgentHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="gpuwm-agent-http", daemon=True)
    thread.start()
    return thread
