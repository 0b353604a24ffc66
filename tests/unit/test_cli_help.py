"""`gpuwm VERB --help` says, for every option, its default (and its choices where it has them), and every
verb has a paragraph saying what it does."""

from __future__ import annotations

import argparse
import re

import pytest

from gpuwm.cli import _VERB_MODULES, build_parser, main
from gpuwm.config import Settings, settings_help

VERBS = [*_VERB_MODULES, "report"] if "report" not in _VERB_MODULES else list(_VERB_MODULES)


def _subparser(verb: str) -> argparse.ArgumentParser:
    parser = build_parser(verb)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: argparse.ArgumentParser = action.choices[verb]
            return chosen
    raise AssertionError(f"no verb {verb}")


@pytest.mark.parametrize("verb", VERBS)
def test_every_option_says_its_default(verb: str) -> None:
    parser = _subparser(verb)
    assert parser.description and len(parser.description) > 80, f"{verb}: no paragraph saying what it does"
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS) or "-h" in action.option_strings:
            continue
        if isinstance(action, argparse._StoreTrueAction | argparse.BooleanOptionalAction):
            continue  # a switch: off unless given (BooleanOptionalAction prints its own default)
        # the help as the verb's formatter writes it (ArgumentDefaultsHelpFormatter adds "(default: …)")
        text = parser._get_formatter()._get_help_string(action) or ""
        assert "default" in text, f"gpuwm {verb} {action.option_strings[0]}: no default in {text!r}"


def test_settings_help_names_choices_default_and_env(capsys: pytest.CaptureFixture[str]) -> None:
    assert settings_help("auth") == (
        "API authentication (one of kubernetes, none; default kubernetes; env GPUWM_AUTH)."
    )
    assert "default 1; env GPUWM_IDLE_THRESHOLD_PERCENT" in settings_help("idle_threshold_percent")
    assert "default 15s:2d,5m:30d" in settings_help("store_rollups")
    assert "default unset" in settings_help("namespace")
    with pytest.raises(SystemExit):
        main(["api", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--auth {kubernetes,none}" in out and "(one of kubernetes, none; default kubernetes; env GPUWM_AUTH)" in out
    assert f"default {Settings().api_listen}" in out


@pytest.mark.parametrize("verb", VERBS)
def test_defaults_are_real_values_and_durations_one_spelling(verb: str) -> None:
    """No "(default: None)", and a duration's default is written as its flag takes it (15s, 2m, 7d), never as
    seconds with a decimal point: `--help` shows what to type."""
    help_text = " ".join(_subparser(verb).format_help().split())
    assert "default: None" not in help_text and "default None" not in help_text
    assert not re.search(r"default \d+\.\d+[;)]", help_text), re.findall(r"default \d+\.\d+[;)]", help_text)


def test_duration_defaults_read_back_as_themselves() -> None:
    from gpuwm.config import format_duration, parse_duration_seconds

    for seconds in (0.25, 1.0, 1.5, 15.0, 90.0, 120.0, 600.0, 7 * 86400.0, 90000.0):
        assert parse_duration_seconds(format_duration(seconds)) == seconds
    assert [format_duration(s) for s in (0.25, 15.0, 90.0, 7 * 86400.0)] == ["250ms", "15s", "1m30s", "7d"]
    assert "default 2m; env GPUWM_STATE_SAVE_INTERVAL" in settings_help("state_save_interval")
