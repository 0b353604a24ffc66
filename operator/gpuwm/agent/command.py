"""`gpuwm agent`: run the node agent, or `--once` to print one snapshot as JSON."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpuwm.config import ConfigError, Settings, add_command, settings_from_arguments
from gpuwm.logs import configure_logging

if TYPE_CHECKING:
    from gpuwm.agent.core import Agent

log = logging.getLogger("gpuwm.agent")

AGENT_SETTINGS = (
    "listen", "interval", "node_name", "pod_resources_socket", "kubelet_url", "kubelet_token_file",
    "kubelet_insecure_tls", "resource_names", "proc_root", "snapshot_buffer_samples", "idle_threshold_percent",
    "time_sliced_replicas", "nvml_buffer_read_seconds", "log_level", "log_format",
)
MIN_INTERVAL_SECONDS = 0.1


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers, "agent", summary="sample this node's GPUs (NVML) and serve /metrics and /v1/snapshot",
        settings=AGENT_SETTINGS, handler=run,
        description="Run on each GPU node (the chart's DaemonSet): sample every GPU and MIG instance through "
        "NVML, map devices to pods through the kubelet's pod-resources socket (processes and cgroups as the "
        "fallback), read pod CPU, memory and network from the kubelet's stats, and serve Prometheus text on "
        "/metrics and the controller's feed on /v1/snapshot. --once prints one snapshot and exits.",
    )
    parser.add_argument("--once", action="store_true", help="print one snapshot as JSON and exit")


def load_settings(arguments: argparse.Namespace) -> Settings:
    settings = settings_from_arguments(arguments, AGENT_SETTINGS)
    if settings.interval < MIN_INTERVAL_SECONDS:
        raise ConfigError(
            f"invalid option: --interval (env GPUWM_INTERVAL): {settings.interval}s is below the "
            f"{MIN_INTERVAL_SECONDS * 1000:.0f}ms minimum; NVML polling faster than that costs more than it tells"
        )
    return settings


def run(arguments: argparse.Namespace) -> int:
    settings = load_settings(arguments)
    configure_logging(settings)
    from gpuwm.agent.core import Agent  # late: pynvml and grpc load only for this verb

    node = settings.node_name or socket.gethostname()
    agent = Agent(settings, node)
    if arguments.once:
        return _once(agent)
    return _serve(agent, settings)


def _once(agent: Agent) -> int:
    if not agent.start_nvml():
        return 1
    try:
        agent.poll_once(read_buffers=True)
        json.dump(json.loads(agent.snapshot_json(0)), sys.stdout, indent=2)
        sys.stdout.write("\n")
    finally:
        agent.stop()
    return 0


def _freeze_startup_objects() -> None:
    """Keep what exists after the first poll (modules, schemas, clients), which lives as long as the
    process, out of the collector's full passes: they would walk all of it now and then for nothing."""
    gc.collect()
    gc.freeze()


def _serve(agent: Agent, settings: Settings) -> int:
    from gpuwm.agent.metrics import MetricsRenderer
    from gpuwm.agent.server import AgentHTTPServer, serve_in_thread
    from gpuwm.config import parse_listen

    try:
        address = parse_listen(settings.listen)
    except ValueError as error:
        raise ConfigError(f"invalid option: {error}") from None
    try:
        server = AgentHTTPServer(address, agent, MetricsRenderer(agent).render)
    except OSError as error:
        log.error("cannot listen on %s: %s; pick a free port with --listen", settings.listen, error)
        return 1
    stop = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping on signal %d", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    serve_in_thread(server)
    log.info("agent listening", extra={"listen": f"{address[0]}:{server.server_address[1]}", "node": agent.node,
                                       "interval_seconds": settings.interval})
    agent.start_nvml()
    started = time.monotonic()
    try:
        agent.run(stop, after_first_poll=_freeze_startup_objects)
    finally:
        server.shutdown()
        server.server_close()
        agent.stop()
        log.info("agent stopped", extra={"uptime_seconds": round(time.monotonic() - started, 1)})
    return 0
