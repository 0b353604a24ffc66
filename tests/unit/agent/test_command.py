"""`gpuwm agent` options: defaults, the 100 ms floor, flags over env."""

from __future__ import annotations

import argparse

import pytest

from gpuwm.agent.command import load_settings
from gpuwm.cli import build_parser, main
from gpuwm.config import ConfigError, parse_listen


def test_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    settings = load_settings(build_parser().parse_args(["agent"]))
    assert settings.listen == "0.0.0.0:9400"
    assert settings.interval == 1.0
    assert settings.node_name == "gpu-node-7"
    assert settings.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert settings.resource_names == ["nvidia.com/gpu", "nvidia.com/mig-*", "nvidia.com/gpu.shared"]
    assert settings.kubelet_url is None


def test_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWM_INTERVAL", "5s")
    arguments = build_parser().parse_args(
        ["agent", "--interval", "250ms", "--resource-names", "nvidia.com/gpu,amd.com/gpu", "--node-name", "x", "--once"]
    )
    settings = load_settings(arguments)
    assert settings.interval == 0.25
    assert settings.resource_names == ["nvidia.com/gpu", "amd.com/gpu"]
    assert settings.node_name == "x"
    assert arguments.once


def test_interval_below_100ms_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--interval"):
        load_settings(build_parser().parse_args(["agent", "--interval", "50ms"]))
    assert main(["agent", "--interval", "0.05", "--once"]) == 2
    assert "100ms minimum" in capsys.readouterr().err


def test_parse_listen() -> None:
    assert parse_listen("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="--listen"):
        parse_listen("9400")


def test_the_agent_verb_loads_no_other_verbs_modules() -> None:
    """`gpuwm agent` runs on every GPU node: the controller's kopf and aiohttp cost it 16 MiB of RSS (63 against 47)."""
    import subprocess
    import sys

    code = ("import sys; from gpuwm.cli import build_parser; build_parser('agent').parse_args(['agent']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'kopf', 'aiohttp', 'fastapi', 'numpy', 'kubernetes'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _verbs(parser: argparse.ArgumentParser) -> list[str]:
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(subparsers.choices)


def test_every_verb_is_listed_and_a_verb_alone_builds_only_its_own() -> None:
    assert _verbs(build_parser()) == ["controller", "agent", "api", "demo", "replay", "report", "version"]
    for verb in ("controller", "agent", "api", "demo", "replay", "report"):
        assert _verbs(build_parser(verb)) == [verb, "version"]
    assert _verbs(build_parser("no-such-verb")) == _verbs(build_parser())  # argparse then names the choices
