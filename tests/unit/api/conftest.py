"""The store most API tests read: `api_data.populate`'s workloads, projects and history in a fresh file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwm.store.embedded import EmbeddedStore

from .api_data import populate


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EmbeddedStore]:
    opened = populate(tmp_path / "gpuwm.db")
    yield opened
    opened.close()
