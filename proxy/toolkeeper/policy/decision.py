"""A decision: allow, deny (with a reason the model reads) or ask, and who made it.

The combining rule: the most restrictive wins (deny > ask > allow), and with
nothing to combine the answer is deny.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Effect = Literal["allow", "deny", "ask"]
_RANK = {"allow": 0, "ask": 1, "deny": 2}


@dataclass(frozen=True)
class Decision:
    effect: Effect
    source: str  # rules | tier | yolo | consent | loop_detector | retry ...
    reason: str = ""
    rule_id: str | None = None
    revision: str | None = None  # which rules decided: a hash of the rules file, or OPA's bundle revision
    decision_id: str | None = None  # OPA's, to find the decision in its own logs
    shadow: tuple[dict[str, str], ...] = ()  # what the shadow rules that matched would have done: {rule, effect}
    flow: tuple[str, ...] = ()  # a rule on the session decided: the record ids of the calls that led to it


def most_restrictive(*decisions: Decision) -> Decision:
    """The strictest decision; among equals, the first given (so name the stronger source first)."""
    if not decisions:
        return Decision("deny", "default", "no policy decided this call")
    return max(decisions, key=lambda d: _RANK[d.effect])
