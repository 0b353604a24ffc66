"""The engine state's copy in a Secret: compressed within what a Secret holds, read back whole or not at all."""

from __future__ import annotations

import base64
import os
import zlib
from pathlib import Path
from typing import Any

import pytest

from gpuwm.controller.kube import KubeApiError
from gpuwm.controller.state.kept import (
    SAVED_AT,
    STATE_KEY,
    KeptState,
    compress_state,
    decompress_state,
)


def test_a_state_round_trips_and_one_too_large_is_not_kept(tmp_path: Path) -> None:
    state = tmp_path / "gpuwm.db.engine.json"
    state.write_bytes(b'{"version": 1, "engine": ' + b"[1.5, 2.5, 3.5], " * 20_000 + b'"end": 0}')
    packed = compress_state(state)
    assert packed is not None and len(packed) < state.stat().st_size / 10
    assert decompress_state(packed) == state.read_bytes()
    assert compress_state(state, limit=64) is None
    noise = tmp_path / "noise"
    noise.write_bytes(os.urandom(200_000))  # does not compress: over the limit
    assert compress_state(noise, limit=100_000) is None


def test_a_damaged_or_oversized_copy_is_refused() -> None:
    with pytest.raises(ValueError, match="not a compressed state"):
        decompress_state(b"not zlib at all")
    bomb = zlib.compress(b"\0" * 1_000_000)
    with pytest.raises(ValueError, match="larger than"):
        decompress_state(bomb, limit=1000)
    with pytest.raises(ValueError, match="cut short"):
        decompress_state(zlib.compress(b"x" * 10_000)[:-8])


class FakeSecrets:
    """The two calls KeptState makes, answered as the API server would (404 until created)."""

    def __init__(self) -> None:
        self.secret: dict[str, Any] | None = None
        self.calls: list[str] = []

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("patch")
        if self.secret is None:
            raise KubeApiError(404, "PATCH", path, "not found")
        self.secret["metadata"]["annotations"].update(body["metadata"]["annotations"])
        self.secret["data"].update(body["data"])
        return self.secret

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        self.secret = body
        return body

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.secret


async def test_the_copy_is_made_then_patched_and_restored_only_when_newer(tmp_path: Path) -> None:
    secrets = FakeSecrets()
    now = [1_800_000_000.0]
    kept = KeptState(secrets, "gpuwm", "gpuwm-controller-state", clock=lambda: now[0])  # type: ignore[arg-type]
    state = tmp_path / "leader" / "gpuwm.db.engine.json"
    state.parent.mkdir()
    state.write_bytes(b'{"version": 1, "saved_at": 1}')
    assert await kept.upload(state) and await kept.upload(state)
    assert secrets.calls == ["patch", "create", "patch"]
    assert secrets.secret is not None and secrets.secret["type"] == "Opaque"
    assert decompress_state(base64.b64decode(secrets.secret["data"][STATE_KEY])) == state.read_bytes()

    standby = tmp_path / "standby" / "gpuwm.db.engine.json"
    assert await kept.download_newer(standby)  # no file of its own: the copy
    assert standby.read_bytes() == state.read_bytes()
    assert standby.stat().st_mtime == float(secrets.secret["metadata"]["annotations"][SAVED_AT])
    assert not await kept.download_newer(standby)  # its own file is as new now
    os.utime(standby, (now[0] - 100, now[0] - 100))
    standby.write_bytes(b"older")
    os.utime(standby, (now[0] - 100, now[0] - 100))
    assert await kept.download_newer(standby) and standby.read_bytes() == state.read_bytes()


async def test_a_copy_on_its_way_is_not_doubled_and_the_stop_waits_for_it(tmp_path: Path) -> None:
    secrets = FakeSecrets()
    secrets.secret = {"metadata": {"annotations": {}}, "data": {}}
    kept = KeptState(secrets, "gpuwm", "gpuwm-controller-state")  # type: ignore[arg-type]
    state = tmp_path / "gpuwm.db.engine.json"
    state.write_bytes(b'{"version": 1}')
    kept.keep_in_background(state)
    kept.keep_in_background(state)  # the first is still on its way: no second
    await kept.keep_now(state)  # waits for it, then the last save's copy
    assert kept.uploads == 2 and secrets.calls == ["patch", "patch"]
