"""Every long-running verb takes --log-format, and the one setup writes JSON lines or text as asked."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from gpuwm.config import Settings
from gpuwm.logs import configure_logging


@pytest.mark.parametrize("verb", ["agent", "controller", "api", "demo"])
def test_every_long_running_verb_takes_log_format(verb: str) -> None:
    result = subprocess.run([sys.executable, "-m", "gpuwm.cli", verb, "--help"], capture_output=True, text=True,
                            check=True)
    assert "--log-format" in result.stdout and "--log-level" in result.stdout


def test_json_lines_carry_the_extra_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(Settings(log_format="json", log_level="info"))
    try:
        logging.getLogger("gpuwm.test").info("agent did not answer", extra={"node": "n1"})
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        logging.getLogger().handlers.clear()
    entry = json.loads(line)
    assert entry["message"] == "agent did not answer" and entry["node"] == "n1" and entry["level"] == "info"


def test_text_lines_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(Settings(log_format="text", log_level="warning"))
    try:
        logging.getLogger("gpuwm.test").info("not shown")
        logging.getLogger("gpuwm.test").warning("shown")
        err = capsys.readouterr().err
    finally:
        logging.getLogger().handlers.clear()
    assert "not shown" not in err and "WARNING gpuwm.test: shown" in err
