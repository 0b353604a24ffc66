"""`gpuwm controller` options and the kopf settings it runs with."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest

from gpuwm.cli import build_parser
from gpuwm.config import ConfigError, Settings
from gpuwm.controller.command import FIELDS, check_settings
from gpuwm.controller.handlers import tune_kopf


def test_flags_cover_the_controller_settings() -> None:
    arguments = build_parser().parse_args([
        "controller", "--status-interval", "5s", "--retention", "2d", "--agents", "static:n1=http://a:9400",
        "--project-label", "team", "--resource-names", "nvidia.com/gpu,amd.com/gpu", "--standalone",
    ])
    assert arguments.verb == "controller" and arguments.status_interval == "5s" and arguments.standalone is True
    assert all(name in Settings.model_fields for name in FIELDS)


def test_every_setting_is_a_flag_of_the_agent_or_the_controller() -> None:
    """The chart sets each setting by its environment variable; each must also be a flag of the process that reads it."""
    from gpuwm.agent.command import AGENT_SETTINGS

    assert set(Settings.model_fields) - set(FIELDS) - set(AGENT_SETTINGS) == set()
    arguments = build_parser().parse_args(["controller", "--snapshot-merge", "30s"])
    assert arguments.snapshot_merge == "30s"


def test_bad_agents_option_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="--agents"):
        check_settings(Settings(agents="dns:whatever"))


def test_kopf_settings_ride_out_api_trouble() -> None:
    settings = kopf.OperatorSettings()
    tune_kopf(settings, Settings(standalone=True, namespace="ml"))
    assert settings.posting.level == logging.WARNING  # no Event per handler log line on users' pods
    assert settings.watching.server_timeout and settings.watching.client_timeout
    assert settings.watching.client_timeout > settings.watching.server_timeout
    assert isinstance(settings.networking.error_backoffs, list) and settings.networking.error_backoffs[-1] >= 30  # 429/5xx retried with growing backoff
    assert settings.peering.standalone is True and settings.peering.mandatory is False
    assert settings.peering.clusterwide is False and settings.peering.name == "gpuwm"


def test_agent_pods_index_and_filters() -> None:
    from gpuwm.controller import handlers

    memo = handlers.configure(Settings(agents="pods:gpuwm/app.kubernetes.io/component=agent"))
    agent_pod = {"metadata": {"name": "agent-x", "namespace": "gpuwm", "labels": {"app.kubernetes.io/component": "agent"}},
                 "spec": {"nodeName": "n7", "containers": [{"name": "agent", "ports": [{"containerPort": 9400}]}]},
                 "status": {"phase": "Running", "podIP": "10.0.0.7"}}
    labels: Any = {"app.kubernetes.io/component": "agent"}
    assert handlers._is_agent_pod(namespace="gpuwm", labels=labels, memo=memo)
    assert not handlers._is_agent_pod(namespace="default", labels=labels, memo=memo)
    index: Any = handlers.agent_pods  # kopf's decorator types it as its callback protocol
    assert index(body=agent_pod, memo=memo) == {"n7": "http://10.0.0.7:9400"}
    gpu_spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    assert handlers._is_gpu_pod(spec=gpu_spec, memo=memo)  # type: ignore[arg-type]
    assert not handlers._is_gpu_pod(spec={"containers": [{"name": "c"}]}, memo=memo)  # type: ignore[arg-type]


def test_open_files_limit_is_raised_toward_the_hard_limit() -> None:
    """One idle connection per agent between pulls: 1,024 open files would not hold 1,000 agents."""
    import resource
    import subprocess
    import sys

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this machine's hard open-files limit is {hard}")
    # in a child, so this test process keeps its own limits
    code = (
        "import resource\n"
        "from gpuwm.controller.command import raise_open_files_limit\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "print(raise_open_files_limit(2048), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["2048", "2048"]
