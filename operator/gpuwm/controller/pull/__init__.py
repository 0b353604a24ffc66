"""Agents → controller intake: which agents exist, pulling their snapshots, checking and decoding them.

The pull ends in a `SampleBatch` for the engine and the device holders each agent names; the
counters of what was refused are exported from here too. This room imports no other room.
"""

from gpuwm.controller.pull.agents import (
    AgentPuller,
    PodAgents,
    SampleIntake,
    StaticAgents,
    agent_url_of_pod,
    index_holders,
    parse_agents_spec,
)
from gpuwm.controller.pull.intake_metrics import EngineCollector, IntakeCollector
from gpuwm.feed.decode import DeviceHolder

__all__ = [
    "AgentPuller",
    "DeviceHolder",
    "EngineCollector",
    "IntakeCollector",
    "PodAgents",
    "SampleIntake",
    "StaticAgents",
    "agent_url_of_pod",
    "index_holders",
    "parse_agents_spec",
]
