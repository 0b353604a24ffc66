"""`gpuwm api`: option errors exit 2 naming the option; a foreign store file is refused, not overwritten."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwm.cli import main


def test_foreign_store_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 10)
    assert main(["api", "--store", str(path), "--auth", "none", "--api-listen", "127.0.0.1:0"]) == 2
    assert "not a SQLite database" in capsys.readouterr().err
    assert path.read_text() == "not a database\n" * 10


def test_bad_listen_and_rollups_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "gpuwm.db")
    assert main(["api", "--store", store, "--auth", "none", "--api-listen", "nowhere"]) == 2
    assert "--api-listen" in capsys.readouterr().err
    assert (
        main(
            [
                "api",
                "--store",
                store,
                "--auth",
                "none",
                "--api-listen",
                "127.0.0.1:0",
                "--store-rollups",
                "15s",
            ]
        )
        == 2
    )
    assert "--store-rollups" in capsys.readouterr().err
    assert main(["api", "--store", store, "--auth", "maybe"]) == 2
    assert "--auth" in capsys.readouterr().err
