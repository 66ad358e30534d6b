"""One decision per declared call: allow, deny (with a reason the model reads) or ask.

Sources, the most restrictive wins (deny > ask > allow), so no source can
loosen another:

- the security team's rules: the built-in YAML rules (rules.py), when one
  matches, and/or Rego evaluated by their OPA server (opa.py);
- yolo and the tiers: a silent tool never asks; a gated one asks unless
  `yolo: true`. yolo only turns this source's ask into an allow: a rule's ask or
  deny holds in yolo.

Both read one document, the policy input (docs/reference/policy-input.md),
built once per call; the same document goes to OPA and into the record.
A policy that cannot be evaluated decides deny (fail closed).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any

from toolkeeper.policy.decision import Decision, most_restrictive
from toolkeeper.tools import DeclaredTool

if TYPE_CHECKING:
    from toolkeeper.policy.opa import OpaPolicy
    from toolkeeper.policy.rules import Rules

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def policy_input(tool: DeclaredTool | str, arguments: Any, argv: list[str] | None, *, agent_id: str = "",
                 agent_header: str | None = None, request_id: str = "", yolo: bool = False,
                 interactive: bool = False, now: datetime | None = None, kind: str = "function",
                 source: str = "agent", tier: str | None = None, workdir: str | None = None) -> dict[str, Any]:
    """The one document every policy source reads. `tool`: a declared tool, or the name of one of the agent's
    own (`tool.source: agent`: its arguments as sent, no argv, no tier), of one the model server runs
    (`hosted`), or of an MCP server's served through toolkeeper (`mcp`, with its server's `tier`); `kind`: the
    call's type as the model sent it (`function`, or a built-in's item type: `shell_call`, `apply_patch_call`, ...,
    or a hosted tool's: `web_search`, `web_search_20250305`, ...); `workdir`: the agent's working directory when its
    door says (a declared tool's is its own; a `local_shell` action names its own)."""
    now = now or datetime.now().astimezone()
    if isinstance(tool, str):
        described = {"name": tool, "source": source, "kind": kind, "tier": tier,
                     "runner": "mcp" if source == "mcp" else None, "visibility": None}
    else:
        described = {"name": tool.name, "source": "declared", "kind": "function", "tier": tool.spec.tier,
                     "runner": tool.spec.runner, "visibility": tool.spec.visibility}
        workdir = str(tool.workdir) if getattr(tool, "workdir", None) else workdir
    action = arguments.get("action") if isinstance(arguments, dict) else None
    if kind == "local_shell_call" and isinstance(action, dict) and isinstance(action.get("working_directory"), str):
        workdir = action["working_directory"]
    return {
        "tool": described,
        "arguments": arguments,
        "argv": argv,
        "agent": {"id": agent_id, "header": agent_header},
        "mode": {"yolo": yolo, "interactive": interactive},
        "workdir": workdir,
        "request": {"id": request_id, "time": now.isoformat(timespec="seconds"), "weekday": WEEKDAYS[now.weekday()],
                    "hour": now.hour},
    }


def tier_decision(document: dict[str, Any]) -> Decision:
    if document["tool"].get("source") == "agent":  # the agent's own: its own consent, unless a rule says otherwise
        return Decision("allow", "default", "no rule matched this call of the agent's own tool")
    if document["tool"].get("source") == "hosted":  # offered by the agent, run by the model server
        return Decision("allow", "default", "no rule matched this tool the model server runs")
    if document["tool"]["tier"] == "silent":
        return Decision("allow", "tier", "silent tools never ask")
    if document["mode"]["yolo"]:
        return Decision("allow", "yolo", "yolo: true")
    return Decision("ask", "yolo", "a gated tool, and yolo: false")


class Policy:
    def __init__(self, yolo: bool, rules: Rules | None = None, opa: OpaPolicy | None = None):
        self.yolo = yolo
        self.rules = rules
        self.opa = opa

    @property
    def governs_agents(self) -> bool:
        """Rules or OPA may decide on the agent's own calls (without them, every such call is allowed)."""
        return self.rules is not None or self.opa is not None

    @property
    def revision(self) -> str | None:
        return self.rules.revision if self.rules else None

    def describe(self) -> str:
        """Which sources decide, for the start line."""
        text = f"rules {self.rules.path.name} @{self.rules.revision}" if self.rules else "no YAML rules"
        if self.opa:
            text += f", OPA {self.opa.url}/v1/data/{self.opa.path}"
        return text

    def tools_named(self, prefix: str) -> set[str]:
        """What follows `prefix` in the tools the YAML rules name one by one (a tool glob without a wildcard):
        for an offer that can switch a server's tools on and off by name (Anthropic's MCP toolset), the tools a
        rule is about. OPA's rules cannot be read so: they decide the server's other tools as a whole."""
        globs = [glob for rule in (self.rules.rules if self.rules else ())
                 for glob in ((rule.when.tool,) if isinstance(rule.when.tool, str) else rule.when.tool or ())]
        return {glob[len(prefix):] for glob in globs
                if glob.startswith(prefix) and len(glob) > len(prefix) and not any(c in glob for c in "*?[")}

    def denied_outright(self, document: dict[str, Any]) -> Decision | None:
        """The YAML rules' deny of a tool whatever its arguments (a rule testing none): such a tool is not even
        offered. OPA, and the rules that test arguments, decide each call."""
        try:
            return self.rules.outright(document) if self.rules else None
        except Exception as exc:  # fail closed
            return Decision("deny", "policy", f"the policy could not be evaluated ({exc!r})", None, self.revision)

    async def decide(self, document: dict[str, Any]) -> Decision:
        try:
            sources = [self.rules.decide(document) if self.rules else None,
                       await self.opa.decide(document) if self.opa else None,
                       tier_decision(document)]
            decision = most_restrictive(*(d for d in sources if d is not None))
            return dataclasses.replace(decision, shadow=self.rules.shadow(document)) if self.rules else decision
        except Exception as exc:  # fail closed
            return Decision("deny", "policy", f"the policy could not be evaluated ({exc!r})", None, self.revision)
