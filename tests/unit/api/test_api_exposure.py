"""What the API shows that it should not: report cells a spreadsheet would run as formulas."""

from __future__ import annotations

import csv
import io

import pytest

from gpuwm.api.report import Report, ReportRow, csv_text_cell, report_csv


@pytest.mark.parametrize("text", ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", '=HYPERLINK("http://x","y")'])
def test_a_cell_that_starts_a_formula_is_text(text: str) -> None:
    assert csv_text_cell(text) == "'" + text


@pytest.mark.parametrize("text", ["alpha", "team-a", "", "1=1", "a+b", "x@y"])
def test_other_cells_are_kept(text: str) -> None:
    assert csv_text_cell(text) == text


def test_the_report_csv_neutralises_names_and_keeps_numbers() -> None:
    row = ReportRow(project="=cmd|' /C calc'!A0", namespace="@team", workload="-train", kind="+Job", workloads=1,
                    allocated_gpu_hours=2.0)
    report = Report(start=0.0, end=3600.0, step_seconds=15.0, by="workload", idle_threshold_percent=1.0,
                    rows=[row], total=ReportRow(workloads=1, allocated_gpu_hours=2.0))
    lines = list(csv.DictReader(io.StringIO(report_csv(report))))
    assert lines[0]["project"] == "'=cmd|' /C calc'!A0"
    assert (lines[0]["namespace"], lines[0]["workload"], lines[0]["kind"]) == ("'@team", "'-train", "'+Job")
    assert lines[0]["allocatedGpuHours"] == "2.000000" and lines[0]["workloads"] == "1"
    assert lines[1]["project"] == "total"
