"""The agent's HTTP server in-process: requests are served, and shutdown() wakes the idle loop."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from gpuwm.agent.core import Agent
from gpuwm.agent.metrics import MetricsRenderer
from gpuwm.agent.server import AgentHTTPServer, serve_in_thread
from gpuwm.config import Settings


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_serves_until_shutdown() -> None:
    agent = Agent(Settings(pod_resources_socket="/nonexistent.sock", proc_root="/nonexistent"), "node-1")
    server = AgentHTTPServer(("127.0.0.1", 0), agent, MetricsRenderer(agent, process_metrics=False).render)
    thread = serve_in_thread(server)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        status, body = _get(base + "/metrics")
        assert status == 200 and b'gpuwm_agent_nvml_up{node="node-1"} 0.0\n' in body
        assert _get(base + "/readyz")[0] == 503  # no NVML in this process
        assert _get(base + "/nope")[0] == 404
        head = urllib.request.Request(base + "/metrics", method="HEAD")
        with urllib.request.urlopen(head, timeout=10) as response:
            assert response.status == 200 and int(response.headers["Content-Length"]) > 0 and response.read() == b""
        post = urllib.request.Request(base + "/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=10)
        assert refused.value.code == 405 and refused.value.headers["Allow"] == "GET, HEAD"
    finally:
        server.shutdown()  # blocks in select with no timeout: shutdown must wake it
        thread.join(timeout=10)
        server.server_close()
    assert not thread.is_alive()


def test_shutdown_before_serving_returns() -> None:
    agent = Agent(Settings(pod_resources_socket="/nonexistent.sock", proc_root="/nonexistent"), "node-1")
    server = AgentHTTPServer(("127.0.0.1", 0), agent, MetricsRenderer(agent, process_metrics=False).render)
    server.shutdown()
    server.server_close()
