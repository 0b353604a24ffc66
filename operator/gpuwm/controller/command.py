"""`gpuwm controller`: the kopf operator that keeps GPUWorkloadMetrics and GPUProjectMetrics current."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from gpuwm.config import ConfigError, Settings, add_command, settings_from_arguments
from gpuwm.logs import wants_json

FIELDS = (
    "log_format", "log_level", "namespace", "standalone", "peering_name", "peering_priority", "liveness",
    "resource_names", "workload_kinds", "project_label", "idle_threshold_percent", "interval", "late_event_window",
    "status_interval", "snapshot_merge", "retention", "agents", "store", "state_save_interval", "state_secret", "idle_condition_after", "underutilized_percent",
    "status_writes_per_second", "status_counters_refresh", "time_sliced_replicas", "device_plugin_config", "api_listen", "auth",
    "runai_compatible_metrics", "cluster_id", "runai_user_label", "store_rollups", "store_latest_rows_per_interval",
    "api_tls", "api_tls_cert_file", "api_tls_key_file", "api_tls_secret", "api_tls_dns_names", "api_token_audience", "api_max_points_per_response",
    "api_max_concurrent_queries", "api_auth_cache_entries", "api_auth_reviews_per_client_per_second",
    "idle_policies", "pricing",
    "api_token_reviews_per_second", "api_trusted_proxies", "api_max_concurrent_queries_per_user",
    "api_query_queue_seconds",
)


def register(subparsers: Any) -> None:
    add_command(
        subparsers, "controller", summary="run the operator: watch GPU pods, pull agents, write CR status",
        settings=FIELDS, handler=run,
        description="Watch GPU pods, pull every agent's /v1/snapshot, account GPU time and write "
                    "GPUWorkloadMetrics / GPUProjectMetrics status. Logs in like kopf run: in-cluster "
                    "service account, else the kubeconfig ($KUBECONFIG).",
    )


def _configure_logging(settings: Settings) -> None:
    import kopf

    json_logs = wants_json(settings)  # gpuwm.logs: the one reading of --log-format; kopf's formatter adds the object
    kopf.configure(
        debug=settings.log_level == "debug", verbose=settings.log_level == "debug",
        quiet=settings.log_level in {"warning", "error"},
        log_format=kopf.LogFormat.JSON if json_logs else kopf.LogFormat.PLAIN,
    )
    logging.getLogger().setLevel(settings.log_level.upper())


def check_settings(settings: Settings) -> None:
    """Reject option combinations kopf would only fail on later, naming the option."""
    from gpuwm.controller.pull import parse_agents_spec

    try:
        parse_agents_spec(settings.agents)
    except ValueError as error:
        raise ConfigError(f"invalid option: --agents (env GPUWM_AGENTS): {error}") from None
    if settings.status_interval <= 0:
        raise ConfigError("invalid option: --status-interval (env GPUWM_STATUS_INTERVAL): must be > 0")


def raise_open_files_limit(wanted: int = 65536) -> int:
    """Lift the soft open-files limit toward the hard one; returns the soft limit in force.

    The agent puller keeps one idle connection per agent between pulls, so a 1,000-node cluster
    holds about 1,000 sockets besides kopf's watches: a runtime's 1,024 default would be too few.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as error:
            logging.getLogger(__name__).warning("could not raise the open-files limit from %d: %s", soft, error)
    return soft


def run(arguments: argparse.Namespace) -> int:
    from gpuwm.controller.kopf_import import import_kopf_without_clients

    import_kopf_without_clients()  # first: nothing of the controller may import kopf before it
    settings = settings_from_arguments(arguments, FIELDS)
    check_settings(settings)
    import kopf
    from kopf._cogs.structs import references  # kopf.run takes an Insights; kopf has no public name for it

    from gpuwm.controller import handlers

    _configure_logging(settings)
    operator_settings = kopf.OperatorSettings()
    missing = missing_credentials(operator_settings)
    if missing:
        print(f"gpuwm controller: {missing}", file=sys.stderr)
        return 1
    raise_open_files_limit()
    memo = handlers.configure(settings)
    memo.insights = insights = references.Insights()  # kopf's record of what it watches, for handlers.look_for_absent_kinds
    handlers.tune_kopf(operator_settings, settings, memo.replica)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        memo.stop_flag = asyncio.Event()  # set by a replica that another one outranks (handlers: it steps down)
        kopf.run(
            loop=runner.get_loop(),
            registry=handlers.REGISTRY,
            memo=memo,
            insights=insights,
            settings=operator_settings,
            identity=memo.replica.identity,
            clusterwide=settings.namespace is None,
            namespaces=[settings.namespace] if settings.namespace else (),
            standalone=settings.standalone,
            liveness_endpoint=settings.liveness,
            stop_flag=memo.stop_flag,
        )
    return 0


def missing_credentials(operator_settings: Any) -> str | None:
    """One line naming what to set when there is neither a pod's service account nor a kubeconfig, else None.

    kopf would retry its startup every few seconds forever, logging the same traceback each time.
    """
    import kopf

    from gpuwm.controller.kube import kube_login

    what_to_set = "set KUBECONFIG to a kubeconfig (or write ~/.kube/config), or run in a pod with a service account"
    quiet = logging.getLogger("gpuwm.controller.login")
    try:
        found = kube_login(operator_settings, quiet)
    except kopf.LoginError:  # kopf's: neither in a cluster nor a kubeconfig
        found = None
    except Exception as error:  # a kubeconfig that cannot be read (YAML, a missing file it names)
        return f"cannot use the Kubernetes credentials ({' '.join(str(error).split())}): {what_to_set}"
    return f"no Kubernetes credentials: {what_to_set}" if found is None else None


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed (as `kopf run` picks it), else asyncio's (None): its pull phase's
    CPU per cycle is steadier, the other phases the same (`bench/controller.py --loop` compares the two)."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
