"""`gpuwm replay TRACE.jsonl`: run a trace through the engine and print the figures at `--at`.

The black-box interface to the engine, and how users check a trace by hand. With `--policy FILE` it also
lists what idle policies would do on the trace, with times; with `--pricing FILE` it prices the figures
(`gpuwm.accounting.replay_steps`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from gpuwm.accounting.engine import Engine
from gpuwm.accounting.replay_steps import (
    ReplayInputError,
    TraceEvents,
    read_policies,
    read_pricing,
    replay_in_steps,
)
from gpuwm.accounting.state import EngineConfig
from gpuwm.config import ConfigError, Settings, add_command, parse_duration_seconds
from gpuwm.model import NamespaceEvent, TraceLineError, gpu_quota, parse_trace_line


def read_trace(path: Path, quota_annotation: str) -> TraceEvents:
    """All events of a trace file, in file order; raises TraceLineError on the first bad line, a namespace
    quota annotation that is not a finite number included (the engine would print "NaN" or "inf": not JSON)."""
    events: TraceEvents = []
    with path.open(encoding="utf-8") as trace:
        for line_number, line in enumerate(trace, start=1):
            if not line.strip():
                continue
            event = parse_trace_line(line, line_number)
            if isinstance(event, NamespaceEvent) and quota_annotation in event.annotations:
                try:
                    gpu_quota(event.annotations[quota_annotation])
                except ValueError as error:
                    raise TraceLineError(line_number, f"annotations.{quota_annotation}", str(error)) from None
            events.append(event)
    return events


def replay(events: TraceEvents, config: EngineConfig, at: float | None = None) -> dict[str, Any]:
    """The report `gpuwm replay` prints: events up to `at` in time order (file order within a time)."""
    ordered = sorted(events, key=lambda event: event.t)  # stable: file order breaks ties
    if at is None:
        at = ordered[-1].t if ordered else 0.0
    engine = Engine(config)
    for event in ordered:
        if event.t > at:
            break
        engine.observe(event)
    workloads, projects, _cluster = engine.report(at)
    return {
        "at": at,
        "workloads": [figures.model_dump(by_alias=True, exclude={"uid"}) for figures in workloads],
        "projects": [figures.model_dump(by_alias=True) for figures in projects],
    }


def _float_option(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if not math.isfinite(number):  # `float` reads "nan" and "inf"
        raise ConfigError(f"{name}: expected a finite number, got {value!r}")
    return number


def _duration_option(name: str, value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        seconds = parse_duration_seconds(value)
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None
    if seconds <= 0:
        raise ConfigError(f"{name}: must be more than 0 seconds, got {value!r}")
    return seconds


def run(arguments: argparse.Namespace) -> int:
    defaults = Settings()
    interval = _duration_option("--interval", arguments.interval, defaults.interval)
    threshold = (
        _float_option("--idle-threshold-percent", arguments.idle_threshold)
        if arguments.idle_threshold is not None
        else defaults.idle_threshold_percent
    )
    if not 0 <= threshold <= 100:
        raise ConfigError(f"--idle-threshold-percent: must be between 0 and 100 percent, got {threshold}")
    at = _float_option("--at", arguments.at) if arguments.at is not None else None
    config = EngineConfig.from_settings(defaults.model_copy(update={
        "interval": interval, "idle_threshold_percent": threshold,
        "project_label": arguments.project_label or defaults.project_label,
    }))
    step = _duration_option("--step", arguments.step, defaults.status_interval)
    try:
        policies = [policy for name in arguments.policy or [] for policy in read_policies(Path(name))]
        pricing = read_pricing(Path(arguments.pricing)) if arguments.pricing else None
    except ReplayInputError as error:
        print(f"gpuwm replay: {error}", file=sys.stderr)
        return 2
    path = Path(arguments.trace)
    try:
        events = read_trace(path, config.quota_annotation)
    except TraceLineError as error:
        print(f"gpuwm replay: {path}: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"gpuwm replay: cannot read {path}: {error.strerror or error}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as error:
        print(f"gpuwm replay: {path}: not UTF-8 text: {error.reason}", file=sys.stderr)
        return 2
    if policies or pricing is not None:
        report = replay_in_steps(events, config, policies, pricing, at, step)
    else:
        report = replay(events, config, at)
    try:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `gpuwm replay ... | head`: the reader left, nothing is wrong
        sys.stderr.close()
    return 0


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers, "replay", handler=run,
        summary="run a trace (JSON lines) through the accounting engine and print the figures",
        description="Read TRACE (one JSON event per line: namespace, pod, workload, sample) and print per-workload and "
        "per-project figures at --at (default: the last event's time).",
    )
    parser.add_argument("trace", metavar="TRACE.jsonl", help="trace file")
    parser.add_argument("--at", default=None, help="report time in seconds (default: the last event's time)")
    parser.add_argument(
        "--interval", default=None, help="the agents' poll interval (default 1s): intervals over 3x are unmonitored"
    )
    parser.add_argument(
        "--idle-threshold-percent", dest="idle_threshold", default=None,
        help="percent at or above which a workload is active (default 1; the name every other verb uses)",
    )
    # the name replay had before it took the shared spelling; kept working, left out of --help
    parser.add_argument("--idle-threshold", dest="idle_threshold", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--project-label", default=None, help="label naming the project (default gpuwm.io/project)")
    parser.add_argument(
        "--policy", action="append", metavar="FILE",
        help="GPUIdlePolicy / ClusterGPUIdlePolicy manifests (YAML or JSON; repeatable): list the steps they would "
        "take on the trace, with times, under \"actions\" (default: none)",
    )
    parser.add_argument(
        "--pricing", metavar="FILE",
        help="the pricing object (as the Helm value pricing, YAML or JSON): add costPerHour, cost, idleCost and "
        "energyCost to every workload and project (default: unpriced)",
    )
    parser.add_argument(
        "--step", default=None,
        help="with --policy or --pricing: how often the figures are evaluated, as the controller's status interval "
        "(default 15s)",
    )
