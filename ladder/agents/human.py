"""The human agent: the supervisor pauses; a person edits and commits on the attempt branch,
declares with `ladder declare LEVEL --attempt N -m "..."`, then runs `ladder resume`."""

from __future__ import annotations

from ladder.agents import AgentResult, AttemptContext


class HumanAgent:
    name = "human"

    def make_change(self, ctx: AttemptContext) -> AgentResult:
        # Never called directly: the graph interrupts for a human instead (see supervisor.graph).
        return AgentResult(error="the human agent works through `ladder declare` and `ladder resume`")
