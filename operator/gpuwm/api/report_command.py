"""`gpuwm report --server URL`: a period report from a running gpuwm API, in the terminal or as CSV, JSON or
FinOps FOCUS.

A client of `GET /api/v1/report` (gpuwm.api.report): no store or cluster access of its own, so it runs
wherever the API can be reached (a port-forward, an Ingress).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpuwm.config import ConfigError, add_command, parse_duration_seconds

FORMATS = ("table", "csv", "json", "focus")
_TABLE_COLUMNS = (
    ("allocatedGpuHours", "alloc GPU-h"),
    ("activeGpuHours", "active GPU-h"),
    ("idleGpuHours", "idle GPU-h"),
    ("unmonitoredGpuHours", "unmon GPU-h"),
    ("wastedGpuHours", "wasted GPU-h"),
    ("energyJoules", "energy kWh"),
    ("meanUtilizationPercent", "mean util %"),
    ("peakAllocatedGpus", "peak GPUs"),
)
#: with pricing: what each row cost, and the part of it that paid for GPUs held and not used
_COST_COLUMNS = (("cost", "cost"), ("idleCost", "idle cost"))


def _duration(text: str) -> float:
    """argparse's type for --timeout: a duration (30s, 2m) or seconds."""
    try:
        return parse_duration_seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers, "report", handler=run,
        summary="print a period report (GPU-hours, idle, energy, cost per project, namespace or workload) from a gpuwm API",
        description="Ask a running gpuwm API (the controller's, `gpuwm api` or `gpuwm demo`) for GET /api/v1/report: "
        "allocated, active, idle, unmonitored and wasted GPU-hours, energy, mean utilisation and peak allocation "
        "per row over START..END, from the stored series, and with `pricing` set what each row cost. Prints a "
        "table, or the API's CSV or JSON for chargeback spreadsheets, or a FinOps FOCUS file (a charge per run, "
        "whatever --by) for finance tools. Reach an in-cluster API with `kubectl port-forward` (docs/install.md).",
    )
    parser.add_argument("--server", default=os.environ.get("GPUWM_SERVER"),
                        help="the API's base URL, e.g. https://127.0.0.1:8080 (default $GPUWM_SERVER; required)")
    parser.add_argument("--token", default=os.environ.get("GPUWM_TOKEN"),
                        help="bearer token, e.g. $(kubectl create token NAME --audience gpuwm) (default "
                             "$GPUWM_TOKEN; none with --auth=none)")
    parser.add_argument("--start", default=None,
                        help="period start: RFC 3339, epoch seconds or milliseconds (default END minus 24h)")
    parser.add_argument("--end", default=None, help="period end, same forms (default the store's latest time)")
    parser.add_argument("--by", choices=("project", "namespace", "workload"), default="project",
                        help="one row per project, namespace or workload (default project)")
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="output (default table); focus: FinOps FOCUS CSV, a charge per run (needs pricing)")
    parser.add_argument("--ca-file", default=None,
                        help="PEM CA bundle that signed the API's certificate (default the system's CAs)")
    parser.add_argument("--insecure-skip-tls-verify", action="store_true", default=False,
                        help="do not check the API's certificate (the chart's self-signed one, over a port-forward)")
    parser.add_argument("--timeout", type=_duration, default=120.0,
                        help="how long to wait for the answer, e.g. 30s or 2m (default 2m)")


def report_url(server: str, start: str | None, end: str | None, by: str, wire_format: str) -> str:
    parsed = urllib.parse.urlsplit(server)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--server {server!r} is not an http:// or https:// URL (e.g. https://127.0.0.1:8080)")
    query = [(name, value) for name, value in (("by", by), ("format", wire_format), ("start", start), ("end", end))
             if value is not None]
    return server.rstrip("/") + "/api/v1/report?" + urllib.parse.urlencode(query)


def fetch(url: str, token: str | None, context: ssl.SSLContext | None, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json, text/csv"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(detail).get("message", detail)
        raise ConfigError(f"{url}: HTTP {error.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ConfigError(f"cannot reach {url}: {reason} (is --server right, and the API reachable?)") from None


def render_table(report: dict[str, Any]) -> str:
    """Rows and the total as aligned text: energy in kWh, hours with two decimals."""
    key_names = {"project": ("project",), "namespace": ("namespace",), "workload": ("namespace", "workload", "kind")}
    keys = key_names.get(str(report.get("by")), ("project",))
    columns = _TABLE_COLUMNS + (_COST_COLUMNS if report.get("currency") else ())
    header = [*keys, *(title for _field, title in columns)]
    lines = []
    for row in [*report.get("rows", []), {**report.get("total", {}), keys[0]: "total"}]:
        cells = [str(row.get(key) or "") for key in keys]
        if row.get("exact") is False:  # a figure apportioned by time: marked, and the total said below
            cells[0] = f"~{cells[0]}"
        for field, _title in columns:
            value = row.get(field)
            if value is None:
                cells.append("–")
            elif field == "energyJoules":
                cells.append(f"{value / 3.6e6:.2f}")
            elif field == "meanUtilizationPercent":
                cells.append(f"{value:.1f}")
            else:
                cells.append(f"{value:.2f}")
        lines.append(cells)
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    text = ["  ".join(cell.ljust(widths[i]) if i < len(keys) else cell.rjust(widths[i])
                      for i, cell in enumerate(line)) for line in [header, *lines]]
    return "\n".join(text) + f"\n({_notes(report)})\n"


def _notes(report: dict[str, Any]) -> str:
    """What the table's figures mean: the resolution, wasted, what was apportioned, the cost's currency."""
    total = report.get("total", {})
    notes = [f"status intervals of {report.get('stepSeconds')} s", "wasted = idle GPU-hours"]
    if not report.get("exact", True):
        notes.append(f"~: {total.get('apportionedGpuHours', 0.0):.2f} GPU-h apportioned by time")
    if report.get("currency"):
        notes.append(f"cost in {report['currency']}, idle cost a part of it")
        if total.get("unpricedGpuHours"):
            notes.append(f"{total['unpricedGpuHours']:.2f} GPU-h unpriced (no price for their GPUs)")
    return "; ".join(notes)


def run(arguments: argparse.Namespace) -> int:
    if not arguments.server:
        raise ConfigError("--server (or env GPUWM_SERVER) is required: the gpuwm API's URL, e.g. http://127.0.0.1:8080")
    context: ssl.SSLContext | None = None
    if arguments.server.startswith("https:"):
        context = ssl.create_default_context(cafile=arguments.ca_file)
        if arguments.insecure_skip_tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    wire = arguments.format if arguments.format in ("csv", "focus") else "json"
    url = report_url(arguments.server, arguments.start, arguments.end, arguments.by, wire)
    body = fetch(url, arguments.token, context, arguments.timeout)
    if arguments.format == "table":
        sys.stdout.write(render_table(json.loads(body)))
    else:
        sys.stdout.write(body.decode())
        if not body.endswith(b"\n"):
            sys.stdout.write("\n")
    return 0
