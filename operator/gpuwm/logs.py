"""One logging setup for every verb: `--log-level` and `--log-format` (`auto`, `json`, `text`).

`auto` writes JSON lines when stderr is not a terminal (a pod's log, collected by the cluster's
log pipeline) and readable text when it is. A JSON line carries the record's `extra` fields, so
structured context (an agent's node, a workload) stays searchable; no caller logs secrets.
The controller hands the same choice to kopf (`kopf.configure`), whose formatter adds the
Kubernetes object each of its lines is about.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from gpuwm.config import Settings


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and the record's extra fields."""

    _standard = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": round(record.created, 3), "level": record.levelname.lower(),
            "logger": record.name, "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._standard})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def wants_json(settings: Settings) -> bool:
    """Whether `--log-format` asks for JSON lines (`auto`: when stderr is not a terminal)."""
    return settings.log_format == "json" or (settings.log_format == "auto" and not sys.stderr.isatty())


def configure_logging(settings: Settings) -> None:
    """The root logger writes to stderr at `--log-level`, as JSON lines or text per `--log-format`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if wants_json(settings) else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
