"""What the removed hand-written HTTP client would save the controller: the rule for a fast twin, measured.

The agent pulls and the status writes go through aiohttp, and a fast twin of library code comes
back only where `bench/` shows it saves at least 5 % of one core at 1,000
nodes. This runs `bench/controller.py` (pass its options after `--`) in turn as the tree is
and with the removed client in place: `controller/agenthttp.py`, read from git at
REVISION (as it was when removed), answering `AgentPuller.get` and the status writes' merge patches
(`KubeClient._send` for PATCH); every other call stays on aiohttp. The runs alternate
(aiohttp, twin, twin, aiohttp, ... : a drift of the machine falls on both), and the summary
gives each run's steady CPU a status cycle, the pull and write phases, the mean saving and
its share of one core against the rule's 5 %.

    .venv/bin/python bench/client_twin.py                         # 2 pairs at full size (~20 min here)
    .venv/bin/python bench/client_twin.py --pairs 1 -- --nodes 100 --cycles 4 --history-minutes 5

Needs the repository's git history (a fresh clone has it); figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import re
import runpy
import statistics
import subprocess
import sys
import types
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: a tree holding controller/agenthttp.py as it was when removed: the file did not change from this tree to its
#: removal
REVISION = "2c6dbcb"
CLIENT_PATH = "operator/gpuwm/controller/agenthttp.py"
#: a fast twin stays only where it saves at least this share of one core (the project's rule for speed tricks)
RULE_SHARE_OF_ONE_CORE = 0.05

_STEADY = re.compile(r"^summary: CPU per (?P<interval>[\d.]+)s cycle mean (?P<cpu>[\d.]+) s", re.M)
_PHASES = re.compile(r"^steady phases, mean CPU-s per cycle: (?P<phases>.*)$", re.M)
_TWIN_CALLS = re.compile(r"^client twin: (?P<calls>.*) through the removed client$", re.M)
_READ_BACK = re.compile(r"^read back from the API at the end: (?P<crs>\d+) GPUWorkloadMetrics, .*; (?P<bare>\d+) with no status",
                        re.M)


def load_client(revision: str) -> types.ModuleType:
    """The removed client as a module, from git; SystemExit saying what is missing when git cannot give it."""
    try:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{CLIENT_PATH}"], check=True,
                                capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(f"client_twin: cannot read {CLIENT_PATH} at {revision} from git ({error}); "
                         "run it in a clone with its history") from None
    module = types.ModuleType("removed_agenthttp")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, f"{revision}:{CLIENT_PATH}", "exec"), module.__dict__)
    return module


def run_with_twin(revision: str, bench_args: list[str]) -> None:
    """bench/controller.py in this process, its agent GETs and status PATCHes through the removed client."""
    sys.path[:0] = [str(ROOT / "operator"), str(ROOT), str(ROOT / "bench")]
    from gpuwm.controller.kopf_import import import_kopf_without_clients

    import_kopf_without_clients()
    from gpuwm.controller.kube import client as kube_client
    from gpuwm.controller.pull import agents

    client_module = load_client(revision)
    clients: dict[float, Any] = {}
    sent = {"GET": 0, "PATCH": 0}
    atexit.register(lambda: print(f"client twin: {sent['GET']} agent GETs and {sent['PATCH']} status PATCHes "
                                  "through the removed client", flush=True))

    def client(timeout_seconds: float) -> Any:
        if timeout_seconds not in clients:
            clients[timeout_seconds] = client_module.AgentHttpClient(timeout_seconds)
        return clients[timeout_seconds]

    async def get(self: agents.AgentPuller, base_url: str, target: str) -> tuple[int, bytes]:
        sent["GET"] += 1
        return await client(self._timeout_seconds).get(base_url, target)  # type: ignore[no-any-return]

    send = kube_client.KubeClient._send

    async def send_patch(self: kube_client.KubeClient, method: str, path: str, params: Any, data: Any,
                         content_type: str) -> tuple[int, str | None, bytes]:
        if method != "PATCH":
            return await send(self, method, path, params, data, content_type)
        sent["PATCH"] += 1
        target = path + ("?" + urllib.parse.urlencode(params) if params else "")
        headers = {name: value for name, value in self._headers.items() if name != "User-Agent"}
        headers["Content-Type"] = content_type
        body = data if isinstance(data, bytes) else str(data).encode()
        status, answer_headers, answer = await client(30.0).request(method, self.server, target, body, headers)
        return status, answer_headers.get("retry-after"), answer

    agents.AgentPuller.get = get  # type: ignore[method-assign]
    kube_client.KubeClient._send = send_patch  # type: ignore[method-assign]
    sys.argv = [str(ROOT / "bench" / "controller.py"), *bench_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


def figures(output: str, errors: str = "") -> tuple[float, float, dict[str, float], str]:
    """(status interval, steady CPU-s a cycle, steady phases, the CRs read back) of one bench/controller.py run."""
    steady, phases, read_back = _STEADY.search(output), _PHASES.search(output), _READ_BACK.search(output)
    if steady is None or phases is None or read_back is None:
        raise SystemExit("client_twin: a bench/controller.py run printed no steady summary:\n"
                         + output[-3000:] + errors[-3000:])
    parsed = {name: float(value) for name, value in (part.split() for part in phases["phases"].split(", "))}
    written = f"{int(read_back['crs']) - int(read_back['bare'])} of {read_back['crs']} CRs with a status"
    return float(steady["interval"]), float(steady["cpu"]), parsed, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="aiohttp/twin pairs, alternating (default 2)")
    parser.add_argument("--revision", default=REVISION, help=f"the tree to take the client from (default {REVISION})")
    parser.add_argument("--inner-twin", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("bench_args", nargs="*", help="bench/controller.py's options, after --")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs: at least 1 pair of runs is needed to compare, got {args.pairs}")
    if args.inner_twin:
        run_with_twin(args.revision, args.bench_args)
        return
    load_client(args.revision)  # fails now, not after the first run, without the history
    order = [variant for pair in range(args.pairs)
             for variant in (("aiohttp", "twin") if pair % 2 == 0 else ("twin", "aiohttp"))]
    results: dict[str, list[tuple[float, dict[str, float]]]] = {"aiohttp": [], "twin": []}
    interval = 15.0
    for number, variant in enumerate(order, 1):
        command = [sys.executable, str(ROOT / "bench" / "controller.py"), *args.bench_args]
        if variant == "twin":
            command = [sys.executable, __file__, "--inner-twin", "--revision", args.revision, "--", *args.bench_args]
        run = subprocess.run(command, check=False, capture_output=True, text=True)
        output = run.stdout
        interval, cpu, phases, written = figures(output, run.stderr)
        results[variant].append((cpu, phases))
        calls = _TWIN_CALLS.search(output)
        if calls is not None:
            written += f"; {calls['calls']} through the removed client"
        print(f"run {number} ({variant}): {cpu:.2f} CPU-s a {interval:g} s cycle; pull {phases['pull']:.2f}, "
              f"writes between cycles {phases['writes_between_cycles']:.2f}; {written}", flush=True)
    means = {variant: statistics.mean(cpu for cpu, _ in runs) for variant, runs in results.items()}
    saving = means["aiohttp"] - means["twin"]
    share = saving / interval
    print(f"mean: aiohttp {means['aiohttp']:.2f}, twin {means['twin']:.2f} CPU-s a cycle; the twin saves "
          f"{saving:.2f} CPU-s a cycle, {100 * share:.1f} % of one core "
          f"({'at or over' if share >= RULE_SHARE_OF_ONE_CORE else 'under'} the rule's "
          f"{100 * RULE_SHARE_OF_ONE_CORE:.0f} %)")


if __name__ == "__main__":
    main()
