"""What the API shows that it should not: report cells a spreadsheet would run as formulas, a dashboard
that runs inline script or can be framed."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuwm.api.app import create_app
from gpuwm.api.report import Report, ReportRow, csv_text_cell, report_csv
from gpuwm.api.routes.operations import STATIC_DIR
from gpuwm.config import Settings

from .api_data import populate


@pytest.mark.parametrize("text", ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", '=HYPERLINK("http://x","y")'])
def test_a_cell_that_starts_a_formula_is_text(text: str) -> None:
    assert csv_text_cell(text) == "'" + text


@pytest.mark.parametrize("text", ["alpha", "team-a", "", "1=1", "a+b", "x@y"])
def test_other_cells_are_kept(text: str) -> None:
    assert csv_text_cell(text) == text


def test_the_report_csv_neutralises_names_and_keeps_numbers() -> None:
    row = ReportRow(project="=cmd|' /C calc'!A0", namespace="@team", workload="-train", kind="+Job", workloads=1,
                    allocated_gpu_hours=2.0)
    row = row.model_copy(update={"currency": "=HYPERLINK(\"x\")", "cost": -1.5})
    report = Report(start=0.0, end=3600.0, step_seconds=15.0, by="workload", idle_threshold_percent=1.0,
                    exact=True, rows=[row], total=ReportRow(workloads=1, allocated_gpu_hours=2.0))
    lines = list(csv.DictReader(io.StringIO(report_csv(report))))
    assert lines[0]["project"] == "'=cmd|' /C calc'!A0"
    assert (lines[0]["namespace"], lines[0]["workload"], lines[0]["kind"]) == ("'@team", "'-train", "'+Job")
    assert lines[0]["allocatedGpuHours"] == "2.000000" and lines[0]["workloads"] == "1"
    assert lines[0]["currency"] == "'=HYPERLINK(\"x\")" and lines[0]["cost"] == "-1.500000"  # a number stays one
    assert lines[1]["project"] == "total"


# -- the dashboard: its own scripts only, never framed, no referrer ----------------------------------


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    store = populate(tmp_path / "gpuwm.db")
    yield TestClient(create_app(store, Settings(auth="none")))
    store.close()


@pytest.mark.parametrize("path", ["/", "/static/dashboard.js", "/docs", "/api/v1/workloads", "/healthz"])
def test_every_answer_carries_the_security_headers(client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert answer.status_code == 200
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["referrer-policy"] == "no-referrer"
    assert answer.headers["x-content-type-options"] == "nosniff"


def test_the_page_holds_no_inline_script_or_style(client: TestClient) -> None:
    """What the policy forbids is not in the page: every script is a file of its own, no style attribute."""
    page = client.get("/").text
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.S)
    assert scripts and all("src=" in attributes and not body.strip() for attributes, body in scripts)
    assert not re.search(r"\son[a-z]+=", page), "an inline event handler"
    assert "style=" not in page
    for name in ("dashboard.js", "chart.js"):
        source = (STATIC_DIR / name).read_text()
        assert "style=" not in source and "localStorage" not in source.replace("never localStorage", ""), name
    assert 'sessionStorage.getItem("gpuwm-token")' in (STATIC_DIR / "dashboard.js").read_text()
