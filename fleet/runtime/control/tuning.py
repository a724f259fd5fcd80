"""What rank 0 says of the driver's adapter: measured rates adopted or kept, policy switches.

The rules live in the driver (`fleet.schedule.adapting`), the same in the simulator; here their
verdicts become lines of `events.jsonl` and banners on the console.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.runtime.control.console import Console
from fleet.runtime.events import EventLog
from fleet.schedule.choice import PolicySwitch
from fleet.schedule.refine import RateChange, Refinement


class AdaptLog:
    """The runtime's `fleet.schedule.adapting.AdaptNotes`: the event log and the console."""

    def __init__(self, log: EventLog, console: Console):
        self.log, self.console = log, console

    def rates_refined(self, changes: tuple[RateChange, ...], verdict: Refinement | None) -> None:
        if verdict is None:
            self.log.write("rates_refined", changes=_shown(changes), at_hops=True)
            self.console.banner(f"rates refined for the next visits: {_summary(changes)}")
            return
        self._weighed("rates_refined", verdict)
        self.console.banner(f"rates refined: {_verdict(verdict)}")

    def rates_kept(self, verdict: Refinement) -> None:
        self._weighed("rates_kept", verdict)
        self.console.banner(f"rates kept: {_verdict(verdict)}")

    def policy_switched(self, switch: PolicySwitch, at: float) -> None:
        self.log.write("policy_switch", at=at, old=switch.current, new=switch.to,
                       predicted_s=switch.predicted_s, cost_s=switch.cost_s)
        self.console.banner(f"policy auto: switching from {switch.current} to {switch.to}: {switch.describe()}")

    def _weighed(self, event: str, verdict: Refinement) -> None:
        self.log.write(event, changes=_shown(verdict.changes), predicted_keep_s=verdict.predicted_keep_s,
                       predicted_new_s=verdict.predicted_new_s, gain_s=verdict.gain_s, cost_s=verdict.cost_s)


def _shown(changes: Sequence[RateChange]) -> list[dict]:
    return [{"model": c.model, "gpus": c.m, "old": round(c.old, 1), "new": round(c.new, 1)} for c in changes]


def _summary(changes: Sequence[RateChange]) -> str:
    worst = max(changes, key=lambda c: abs(c.relative))
    return (f"{len(changes)} rate(s) moved >= 10% (e.g. {worst.model} on {worst.m} GPU(s): {worst.old:,.0f} -> "
            f"{worst.new:,.0f} samples/s)")


def _verdict(verdict: Refinement) -> str:
    return f"{_summary(verdict.changes)}; predicted gain {verdict.gain_s:.1f} s vs cost {verdict.cost_s:.1f} s"
