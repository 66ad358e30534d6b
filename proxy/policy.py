"""One decision per declared call: allow, deny (with a reason the model reads) or ask.

For now the sources are the tool's tier and the agent file's `yolo`; the
security team's rules (YAML, or Rego through OPA) join them here, combined so
that the most restrictive wins (deny > ask > allow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.agentfile import DeclaredTool

Effect = Literal["allow", "deny", "ask"]
_RANK = {"allow": 0, "ask": 1, "deny": 2}


@dataclass(frozen=True)
class Decision:
    effect: Effect
    source: str
    reason: str = ""


def most_restrictive(*decisions: Decision) -> Decision:
    if not decisions:
        return Decision("deny", "default", "no policy decided this call")
    return max(decisions, key=lambda d: _RANK[d.effect])


class TierPolicy:
    """yolo and tiers: a silent tool never asks; a gated one asks unless yolo."""

    def __init__(self, yolo: bool):
        self.yolo = yolo

    def decide(self, tool: DeclaredTool) -> Decision:
        if tool.spec.tier == "silent":
            return Decision("allow", "tier", "silent tools never ask")
        if self.yolo:
            return Decision("allow", "yolo", "yolo: true")
        return Decision("ask", "yolo", "gated tool and yolo: false")
