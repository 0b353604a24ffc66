"""`gpuwm api --store PATH|URL`: the metrics API alone (more replicas on a Prometheus store, or local use)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

from gpuwm.config import ConfigError, add_command, parse_listen, settings_from_arguments
from gpuwm.logs import configure_logging

FIELDS = (
    "log_format",
    "store",
    "api_listen",
    "api_tls",
    "api_tls_cert_file",
    "api_tls_key_file",
    "api_token_audience",
    "api_max_points_per_response",
    "api_max_concurrent_queries",
    "api_max_concurrent_queries_per_user",
    "api_query_queue_seconds",
    "api_auth_cache_entries",
    "api_auth_reviews_per_client_per_second",
    "api_token_reviews_per_second",
    "api_trusted_proxies",
    "auth",
    "runai_compatible_metrics",
    "cluster_id",
    "runai_user_label",
    "pricing",
    "store_rollups",
    "retention",
    "log_level",
)


def register(subparsers: Any) -> None:
    add_command(
        subparsers, "api", summary="serve the metrics API, dashboard and /metrics over a store", settings=FIELDS,
        handler=run,
        description="Serve the metrics API (/api/v1/..., OpenAPI at /openapi.json, reference at /docs), the "
        "dashboard (/) and Prometheus' /metrics over an existing store, without the controller: more API "
        "replicas over a Prometheus store, or a look at an embedded store file copied off a cluster. HTTPS "
        "by default (a self-signed certificate unless --api-tls-cert-file); --auth=kubernetes checks bearer "
        "tokens with TokenReview and SubjectAccessReview, so it needs cluster credentials.",
    )


def run(arguments: argparse.Namespace) -> int:
    settings = settings_from_arguments(arguments, FIELDS)
    configure_logging(settings)
    from gpuwm.api.app import create_app
    from gpuwm.api.auth import AuthError
    from gpuwm.api.server import ApiServer
    from gpuwm.api.tls import API_CERTIFICATE_OPTIONS, TlsError, tls_files
    from gpuwm.store import StoreError, open_store

    try:
        host, port = parse_listen(settings.api_listen, "--api-listen", 8080)
        tls = tls_files(
            settings.api_tls, settings.api_tls_cert_file, settings.api_tls_key_file, host, API_CERTIFICATE_OPTIONS
        )
        store = open_store(
            settings.store, rollups=settings.store_rollups, retention_seconds=settings.retention
        )
    except (ValueError, TlsError, StoreError) as error:
        raise ConfigError(str(error)) from None
    try:
        app = create_app(store, settings)
    except AuthError as error:
        store.close()
        raise ConfigError(error.message) from None

    async def main() -> None:
        server = ApiServer(app, host, port, log_level=settings.log_level, tls=tls)
        await server.start()
        logging.getLogger("gpuwm.api").info(
            "metrics API listening on %s://%s:%d (store %s)", server.scheme, host, server.port, settings.store
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        await server.stop()

    try:
        asyncio.run(main())
    finally:
        store.close()
    return 0
