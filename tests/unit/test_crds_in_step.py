"""crds/ and charts/gpuwm/crds/ hold the same files, kopf's peering CRDs included: a GitOps install that
applies crds/ alone gets every CRD the controller needs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_top_level_crds_equal_the_charts() -> None:
    top = {path.name: path.read_bytes() for path in (ROOT / "crds").glob("*.yaml")}
    chart = {path.name: path.read_bytes() for path in (ROOT / "charts" / "gpuwm" / "crds").glob("*.yaml")}
    assert "kopf.dev_peerings.yaml" in top
    assert sorted(top) == sorted(chart), "crds/ and charts/gpuwm/crds/ list different files"
    differing = [name for name in top if top[name] != chart[name]]
    assert not differing, f"differ: {differing}; run python scripts/sync-crds.py (gpuwm.io_*) or copy kopf's"
