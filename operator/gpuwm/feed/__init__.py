"""The agent -> controller feed (`/v1/snapshot`, docs/snapshot-feed.md) in one place.

- `schema`: the answer's devices (pydantic) and the columnar form's field lists;
- `encode`: what the agent writes (`answer_json`: the answer's bytes, rows or columns; `sample_columns`,
  `devices_members`);
- `merge`: what the controller asks (`MergeRequest`) and how the agent merges runs of polls;
- `decode`: what the controller reads (`parse_snapshot` -> `Snapshot`, `DeviceHolder`), with
  `arrays` reading the columns into numpy arrays and the engine's `SampleBatch`.

Below the agent and the controller, above the engine: both sides import the feed and neither
imports the other's internals. The agent imports this face (schema, encoder, merging); the
controller imports the decoder from `gpuwm.feed.decode`, its own face, which this one leaves
out so that the agent does not load numpy and the engine it needs.
"""

from gpuwm.feed.encode import answer_json, columns_answer_json, devices_members, sample_columns
from gpuwm.feed.merge import MergeRequest, merge_polls, merge_request
from gpuwm.feed.schema import (
    DEVICE_FIELDS,
    DEVICES_TAG_MAX_LENGTH,
    DEVICES_TAG_PARAM,
    SNAPSHOT_FORMATS,
    AgentDevice,
    DeviceState,
)

__all__ = [
    "DEVICES_TAG_MAX_LENGTH", "DEVICES_TAG_PARAM", "DEVICE_FIELDS", "SNAPSHOT_FORMATS", "AgentDevice",
    "DeviceState", "MergeRequest", "answer_json", "columns_answer_json", "devices_members", "merge_polls",
    "merge_request", "sample_columns",
]
