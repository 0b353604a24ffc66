"""The rows form of `/v1/snapshot` (`format=rows`) as a pydantic model, to read an agent's answer with.

The agent writes rows with `gpuwm.feed.encode` and the controller reads columns only, so the
rows' envelope is checked here, by the tests, and not by a model in the package.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuwm.feed import AgentDevice
from gpuwm.model import GpuSample, PodStatsSample


class AgentSnapshot(BaseModel):
    """`GET /v1/snapshot?since=SEQ` in rows (`format=rows`): the records after SEQ and the current devices.

    The form people read; the controller asks for columns and refuses rows (see `gpuwm.feed.decode`).
    """

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    node: str
    seq: int = Field(ge=0, description="Latest sequence number; pass it as `since` on the next pull.")
    agent_id: str = Field(description="Changes when the agent restarts (sequence numbers start over).")
    truncated: bool = Field(
        default=False, description="True when records after `since` had already left the bounded buffer."
    )
    more: bool = Field(default=False, description="True when `limit` cut the records short: pull again from `seq`.")
    samples: list[GpuSample] = Field(default_factory=list)
    pod_stats: list[PodStatsSample] = Field(default_factory=list)
    devices: list[AgentDevice] = Field(default_factory=list)
