"""Agents → controller intake: which agents exist, pulling their snapshots, feeding them to the engine.

`agents` finds and pulls the agents (the feed's decoder, `gpuwm.feed.decode`, reads each
answer); `intake` feeds the decoded samples to the engine and keeps the device holders each
agent names; `intake_metrics` exports the counters of what was refused. This room imports no
other room.
"""

from gpuwm.controller.pull.agents import (
    AgentPuller,
    PodAgents,
    PullResult,
    StaticAgents,
    agent_url_of_pod,
    index_holders,
    parse_agents_spec,
)
from gpuwm.controller.pull.intake import SampleIntake
from gpuwm.controller.pull.intake_metrics import EngineCollector, IntakeCollector
from gpuwm.feed.decode import DeviceHolder

__all__ = [
    "AgentPuller", "DeviceHolder", "EngineCollector", "IntakeCollector", "PodAgents", "PullResult",
    "SampleIntake", "StaticAgents", "agent_url_of_pod", "index_holders", "parse_agents_spec",
]
