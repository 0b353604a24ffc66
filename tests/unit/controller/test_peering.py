"""Which replica leads: kopf's rule on the peering object's records, the derived priorities, and a controller
started with no cluster at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwm.controller.kube import replica_priority, this_replica
from gpuwm.controller.kube.peering import PeerRecord, peer_records, rivals

NOW = 1_800_000_000.0


def test_an_earlier_start_ranks_higher_and_a_given_priority_outranks_every_derived_one() -> None:
    first, second = replica_priority(NOW), replica_priority(NOW + 0.000_002)
    assert first > second  # the longest-running replica leads; a newcomer never takes over
    assert first < 0  # kopf's --dev (666) and any priority given by hand outrank them
    assert this_replica(666, 15, environ={}).priority == 666


def test_the_replica_is_its_pod_and_its_record_lives_one_status_interval() -> None:
    replica = this_replica(None, 15, environ={"POD_NAME": "gpuwm-controller-7d9f-abcde"})
    assert replica.identity == "gpuwm-controller-7d9f-abcde"
    assert replica.lifetime_seconds == 15
    assert this_replica(None, 1, environ={}).lifetime_seconds == 10  # kopf writes every lifetime less 5-10 s
    assert "/" in this_replica(None, 15, environ={}).identity  # outside a pod: host and process


def test_kopfs_records_are_read_and_the_broken_ones_skipped() -> None:
    peering = {"status": {
        "pod-a": {"priority": -5, "lifetime": 15, "lastseen": "2027-01-15T08:00:00+00:00"},
        "pod-b": {"priority": 7, "lifetime": 60, "lastseen": "2027-01-15T08:00:00.5"},  # naive: UTC, as kopf writes
        "pod-c": None,  # removed (lifetime 0 patched to null)
        "pod-d": {"priority": "high", "lastseen": "2027-01-15T08:00:00+00:00"},
        "pod-e": {"priority": 1},
    }}
    records = {record.identity: record for record in peer_records(peering)}
    assert set(records) == {"pod-a", "pod-b"}
    assert records["pod-a"].priority == -5
    assert records["pod-b"].deadline - records["pod-a"].deadline == pytest.approx(45.5)


def test_live_records_at_or_above_a_priority_are_rivals_as_kopf_pauses_for_them() -> None:
    records = [
        PeerRecord(identity="me", priority=0, deadline=NOW + 10),
        PeerRecord(identity="older", priority=5, deadline=NOW + 10),
        PeerRecord(identity="twin", priority=0, deadline=NOW + 10),
        PeerRecord(identity="dead", priority=9, deadline=NOW - 1),
        PeerRecord(identity="newer", priority=-3, deadline=NOW + 10),
    ]
    assert [record.identity for record in rivals(records, "me", 0, NOW)] == ["older", "twin"]
    assert rivals(records, "older", 5, NOW) == []  # the highest live priority leads
    assert rivals(records, "older", 5, NOW + 11) == []


def test_a_controller_without_a_cluster_exits_1_with_one_line(tmp_path: Path) -> None:
    """No service account, no kubeconfig: one line naming what to set, exit status 1, no traceback loop."""
    env = {key: value for key, value in os.environ.items()
           if key not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}}
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "gpuwm.cli", "controller", "--store", str(tmp_path / "gpuwm.db")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "KUBECONFIG" in lines[0], done.stderr
    (tmp_path / "broken").write_text("clusters: [")
    env["KUBECONFIG"] = str(tmp_path / "broken")
    done = subprocess.run([sys.executable, "-m", "gpuwm.cli", "controller", "--store", str(tmp_path / "gpuwm.db")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot use the Kubernetes credentials" in done.stderr
