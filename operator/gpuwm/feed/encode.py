"""The feed's encoder: what an agent sends in its columnar answer (`?format=columns`): one array per sample field.

The row form repeats every field name and every device-constant value in each sample, and a
reader validates one object per sample. Here the samples of a snapshot become:

    "gpus": [{"uuid", "node", "index", "model", "parent_uuid", "mig_profile", "device_units",
              "memory_total_bytes", "power_limit_watts"}, ...]   one entry per distinct combination
    "columns": {"gpu": [entry of each row], "t": [...], "seq": [...], "healthy": [...],
                "sm_percent": [... null where not reported], ...}   one array per field
    "errors": {"ROW": "NVML error", ...}                           rows with an error only
    "processes": {"row": [...], "pid": [...], "pod_uid": [...], "container": [...],
                  "sm_percent": [...], "memory_used_bytes": [...], "empty": [ROW, ...]}

Rows keep the agent's sequence order. A device whose table fields change within a snapshot
(a new power limit) gets a second `gpus` entry, so every field of every sample survives. A
column missing from `columns` is null in every row (`healthy`: true in every row); `errors`
and `processes` are left out when no row has one. `processes` lists each process of a row
in order, flattened (`row` says whose); a row in `empty` had `processes: []` (per-process
data saying "none"), a row in neither had no per-process data (null). The field lists are
`gpuwm.feed.schema`'s; `gpuwm.feed.decode` reads what this writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from hashlib import blake2b
from typing import Any

import orjson

from gpuwm.feed.merge import MergeRequest, merge_polls
from gpuwm.feed.schema import DEVICE_FIELDS, NUMBER_COLUMNS, PROCESS_FIELDS, device_key


def sample_columns(samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The `gpus`, `columns`, `errors` and `processes` members for samples given as JSON objects (rows)."""
    entries: dict[tuple[Any, ...], int] = {}
    gpu: list[int] = []
    t: list[Any] = []
    healthy: list[bool] = []
    numbers: dict[str, list[Any]] = {name: [] for name in NUMBER_COLUMNS}
    errors: dict[str, str] = {}
    processes: dict[str, list[Any]] = {name: [] for name in ("row", *PROCESS_FIELDS)}
    empty: list[int] = []
    for row, sample in enumerate(samples):
        gpu.append(entries.setdefault(device_key(sample), len(entries)))
        t.append(sample.get("t"))
        healthy.append(sample.get("healthy", True))
        for name, column in numbers.items():
            column.append(sample.get(name))
        error = sample.get("error")
        if error is not None:
            errors[str(row)] = error
        listed = sample.get("processes")
        if listed is not None:
            if not listed:
                empty.append(row)
            for process in listed:
                processes["row"].append(row)
                for name in PROCESS_FIELDS:
                    processes[name].append(process.get(name))
    columns: dict[str, Any] = {"gpu": gpu, "t": t}
    if not all(healthy):
        columns["healthy"] = healthy
    columns.update((name, column) for name, column in numbers.items() if any(value is not None for value in column))
    result: dict[str, Any] = {"gpus": [dict(zip(DEVICE_FIELDS, key, strict=True)) for key in entries], "columns": columns}
    if errors:
        result["errors"] = errors
    if processes["row"] or empty:
        result["processes"] = {**processes, "empty": empty}
    return result


def answer_json(
    head: Mapping[str, Any], samples: Sequence[bytes], pod_stats: Sequence[bytes], devices_json: bytes, *,
    columns: bool = False, merge: MergeRequest | None = None, devices_tag: str | None = None,
) -> bytes:
    """An agent's answer to `/v1/snapshot` as JSON: `head` (node, seq, agent_id, truncated, more), the records
    after `since` as the agent's buffer keeps them (each one's JSON) and its devices' JSON.

    Rows (the default, for people): the records' JSON is spliced in as stored, without parsing it
    again. `columns` (`format=columns`, what the controller reads): the samples as one array per
    field (`sample_columns`), `gpus` and `devices` left out when they are those the controller
    holds under `devices_tag` (`devices_members`). `merge`: runs of polls that the accounting
    cannot tell apart go as one sample each (`gpuwm.feed.merge`).
    """
    head = dict(head)
    parsed = None
    if columns or merge is not None:
        parsed = orjson.loads(b"[" + b",".join(samples) + b"]")
        if merge is not None:
            parsed = merge_polls(parsed, merge)
    if columns:
        head["format"] = "columns"
        members = sample_columns(parsed or [])
        gpus_json = orjson.dumps(members.pop("gpus"))
        head.update(members)
        samples_member = b""
        device_members = devices_members(gpus_json, devices_json, devices_tag)
    else:
        samples_member = b',"samples":' + (orjson.dumps(parsed) if parsed is not None else
                                           b"[" + b",".join(samples) + b"]")
        device_members = b',"devices":' + devices_json
    return b"".join((
        orjson.dumps(head)[:-1], samples_member,
        b',"pod_stats":[', b",".join(pod_stats), b"]",
        device_members, b"}",
    ))


def devices_members(gpus_json: bytes, devices_json: bytes, known_tag: str | None) -> bytes:
    """A columnar answer's `gpus` and `devices` members with their tag (`,"devices_tag":...`), or only the tag and
    `"devices_unchanged":true` when they are what the puller holds under `known_tag` (it sent `?devices_tag=`).

    A node's devices and their holders rarely change, yet would be most of each answer, for the
    puller to read and check per agent and pull. The tag is a digest of exactly the two
    members' JSON, so an answer left without them always means the very ones the puller keeps,
    whatever happened between (an agent restart that finds the same devices gives the same tag).
    """
    tag = blake2b(gpus_json + b"\n" + devices_json, digest_size=16).hexdigest()
    if known_tag == tag:
        return b',"devices_tag":"' + tag.encode() + b'","devices_unchanged":true'
    return b',"gpus":' + gpus_json + b',"devices":' + devices_json + b',"devices_tag":"' + tag.encode() + b'"'


def columns_answer_json(answer: Mapping[str, Any], known_tag: str | None) -> bytes:
    """A columnar answer given as one object (its `gpus` and `devices` among its members) as JSON, those two as
    `devices_members` gives them: for what serves the feed from objects (the simulator, test agents)."""
    rest = {key: value for key, value in answer.items() if key not in ("gpus", "devices")}
    members = devices_members(orjson.dumps(answer.get("gpus") or []), orjson.dumps(answer.get("devices") or []),
                              known_tag)
    return orjson.dumps(rest)[:-1] + members + b"}"
