"""`gpuwm demo`: the product on a simulated GPU fleet; `--write-trace` writes a replay trace instead."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gpuwm.config import ConfigError, add_command, parse_duration_seconds, settings_from_arguments
from gpuwm.logs import configure_logging

FIELDS = (
    "interval",
    "idle_threshold_percent",
    "project_label",
    "late_event_window",
    "status_interval",
    "store_rollups",
    "store_latest_rows_per_interval",
    "retention",
    "log_level",
    "log_format",
)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers, "demo",
        summary="run gpuwm (engine, store, API, dashboard) on a simulated GPU fleet; no cluster needed",
        settings=FIELDS, handler=run,
        description="Simulate a GPU cluster (whole, MIG and time-sliced GPUs; training, batch, notebook and "
        "inference workloads) and serve gpuwm's API and dashboard on it. With --write-trace, write the "
        "simulated run as a replay trace for `gpuwm replay` and exit.",
    )
    parser.add_argument("--nodes", type=int, default=8, help="simulated GPU nodes (default 8)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node, 1-16 (default 8)")
    parser.add_argument("--speed", type=float, default=60.0, help="simulated seconds per real second (default 60)")
    parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT of the API and dashboard (default 127.0.0.1:8080)")
    parser.add_argument("--seed", type=int, default=1, help="random seed: the same seed gives the same run (default 1)")
    parser.add_argument("--warmup", default="20m", help="simulated history before now, computed at start (default 20m)")
    parser.add_argument("--store", default=None, help="embedded store file (default: a temporary file)")
    parser.add_argument("--faults", action=argparse.BooleanOptionalAction, default=False,
                        help="an agent outage and a lost GPU during the warm-up")
    parser.add_argument("--table", action=argparse.BooleanOptionalAction, default=None,
                        help="live table in the terminal (default: when stdout is a terminal)")
    parser.add_argument("--write-trace", default=None, metavar="FILE",
                        help="write --duration of simulated run as a replay trace to FILE and exit (default: serve the demo)")
    parser.add_argument("--write-truth", default=None, metavar="FILE",
                        help="with --write-trace: also write the simulator's ground truth per workload (JSON; default: not written)")
    parser.add_argument("--duration", default="1h", help="with --write-trace: simulated time to write (default 1h)")
    parser.add_argument("--start", type=float, default=0.0, help="with --write-trace: first sample time (default 0)")
    parser.add_argument("--policy", action="append", metavar="FILE",
                        help="idle policies to run as a dry run, as for gpuwm replay (default: warn after 10 idle "
                        "minutes, scale to zero or suspend 20 minutes later)")
    parser.add_argument("--pricing", metavar="FILE",
                        help="GPU prices, as for gpuwm replay (default: the demo's list prices of its GPU models)")
    parser.set_defaults(log_level="warning")


def _seconds(flag: str, value: str) -> float:
    try:
        seconds = parse_duration_seconds(value)
    except ValueError as error:
        raise ConfigError(f"{flag}: {error}") from None
    if seconds < 0:
        raise ConfigError(f"{flag}: must not be negative, got {value!r}")
    return seconds


def _check_fleet(arguments: argparse.Namespace) -> None:
    if arguments.nodes < 1:
        raise ConfigError(f"--nodes: need at least 1 node, got {arguments.nodes}")
    if not 1 <= arguments.gpus_per_node <= 16:
        raise ConfigError(f"--gpus-per-node: must be 1 to 16, got {arguments.gpus_per_node}")
    if arguments.speed <= 0:
        raise ConfigError(f"--speed: must be more than 0, got {arguments.speed}")


def run(arguments: argparse.Namespace) -> int:
    settings = settings_from_arguments(arguments, FIELDS)
    configure_logging(settings)
    _check_fleet(arguments)
    if arguments.write_trace is not None:
        return _write_trace(arguments, settings.interval, settings.idle_threshold_percent)
    from gpuwm.sim.demo import DemoOptions, run_demo
    from gpuwm.store import StoreError

    policies = _demo_policies(arguments)
    options = DemoOptions(
        nodes=arguments.nodes, gpus_per_node=arguments.gpus_per_node, speed=arguments.speed,
        listen=arguments.listen, seed=arguments.seed, warmup_seconds=_seconds("--warmup", arguments.warmup),
        store_path=arguments.store, faults=arguments.faults,
        table=sys.stdout.isatty() if arguments.table is None else arguments.table, settings=settings,
        policies=policies,
    )
    try:
        return asyncio.run(run_demo(options))
    except (StoreError, ValueError) as error:  # a store file it cannot use, a bad --listen
        raise ConfigError(str(error)) from None
    except OSError as error:  # the port is taken
        raise ConfigError(f"--listen {arguments.listen}: cannot listen there ({error.strerror or error}); "
                          "pick another port, e.g. --listen 127.0.0.1:8081") from None


def _demo_policies(arguments: argparse.Namespace) -> Any:
    """The dry-run policies and prices the demo shows (`--policy`, `--pricing`, else its own)."""
    from gpuwm.accounting import ReplayInputError, read_policies, read_pricing
    from gpuwm.sim.policies import DemoPolicies

    try:
        policies = [p for name in arguments.policy or [] for p in read_policies(Path(name))] or None
        pricing = read_pricing(Path(arguments.pricing)) if arguments.pricing else None
    except ReplayInputError as error:
        raise ConfigError(str(error)) from None
    return DemoPolicies.with_defaults(policies, pricing)


def _write_trace(arguments: argparse.Namespace, interval: float, threshold: float) -> int:
    from gpuwm.sim.simulator import faulted_simulator
    from gpuwm.sim.trace import truth_report, write_trace

    duration = _seconds("--duration", arguments.duration)
    start = float(arguments.start)
    simulator = faulted_simulator(arguments.seed, arguments.nodes, arguments.gpus_per_node, interval, start, threshold,
                                  duration if arguments.faults else None)
    path = Path(arguments.write_trace)
    try:
        with path.open("w", encoding="utf-8") as out:
            lines = write_trace(simulator, start + duration, out)
        if arguments.write_truth:
            Path(arguments.write_truth).write_text(json.dumps(truth_report(simulator), indent=2) + "\n")
    except OSError as error:
        raise ConfigError(f"--write-trace/--write-truth: cannot write ({error.strerror or error}): "
                          f"{error.filename}") from None
    print(f"gpuwm demo: wrote {lines} events ({duration:g} simulated seconds, {len(simulator.workloads)} workloads) "
          f"to {path}; replay with: gpuwm replay {path} --interval {interval:g}", file=sys.stderr)
    return 0
