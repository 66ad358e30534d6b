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
import fnmatch
from datetime import datetime
from typing import TYPE_CHECKING, Any

from toolkeeper.policy.decision import Decision, most_restrictive
from toolkeeper.policy.flows import empty_session
from toolkeeper.tools import DeclaredTool

if TYPE_CHECKING:
    from toolkeeper.policy.opa import OpaPolicy
    from toolkeeper.policy.rules import Rules

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def policy_input(tool: DeclaredTool | str, arguments: Any, argv: list[str] | None, *, agent_id: str = "",
                 agent_header: str | None = None, request_id: str = "", yolo: bool = False,
                 interactive: bool = False, now: datetime | None = None, kind: str = "function",
                 source: str = "agent", tier: str | None = None, workdir: str | None = None,
                 principal: dict[str, Any] | None = None, labels: Any = (),
                 session: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one document every policy source reads. `tool`: a declared tool, or the name of one of the agent's
    own (`tool.source: agent`: its arguments as sent, no argv, no tier), of one the model server runs
    (`hosted`), or of an MCP server's served through toolkeeper (`mcp`, with its server's `tier`); `kind`: the
    call's type as the model sent it (`function`, or a built-in's item type: `shell_call`, `apply_patch_call`, ...,
    or a hosted tool's: `web_search`, `web_search_20250305`, ...); `workdir`: the agent's working directory when its
    door says (a declared tool's is its own; a `local_shell` action names its own); `principal`: who the call is
    for (identity.Principal's document), else only the agent; `labels`: the call's own, its tool's and the label
    rules' (`Policy.labels`); `session`: what its session has seen (empty when none). `secrets` is the scan of an
    `egress` call's arguments, filled in afterwards (none found here); `limits` the counts of the limits that select
    the call, filled in when they are taken (engine/limits.py)."""
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
        "principal": principal_document(principal, agent_id),
        "mode": {"yolo": yolo, "interactive": interactive},
        "workdir": workdir,
        "request": {"id": request_id, "time": now.isoformat(timespec="seconds"), "weekday": WEEKDAYS[now.weekday()],
                    "hour": now.hour},
        "labels": sorted(set(labels)),
        "session": session if session is not None else empty_session(),
        "secrets": {"arguments": []},
        "limits": {},
    }


def principal_document(principal: dict[str, Any] | None, agent_id: str) -> dict[str, Any]:
    """The policy input's `principal`, every field there (a rule reads `principal.groups` without asking first
    whether it exists): the agent alone when no token or trusted header named a user."""
    document = {"agent": agent_id, "user": None, "groups": [], "issuer": None, "claims": {}}
    document.update({key: value for key, value in (principal or {}).items() if key in document})
    document["agent"] = document["agent"] or agent_id
    return document


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
        globs = [glob for rule in (self.rules.rules if self.rules else ()) if rule.effect != "label"
                 for glob in ((rule.when.tool,) if isinstance(rule.when.tool, str) else rule.when.tool or ())]
        return {glob[len(prefix):] for glob in globs
                if glob.startswith(prefix) and len(glob) > len(prefix) and not any(c in glob for c in "*?[")}

    def unnamed_restricted(self, document: dict[str, Any]) -> Decision | None:
        """For an offer that lets the model server run tools no one names (`mcp__<server>__*`, the connector's
        tools that no `configs` entry or `allowed_tools` list names): the deny (or ask) of the first rule in force
        that could cover one of them without covering the offer itself: its tool a pattern under the server's
        prefix (`mcp__github__delete_*`), or none at all with other conditions a named tool would meet (`kind:
        mcp_tool`). Which of the server's tools such a rule covers cannot be known before the model server lists
        them, so the offer fails closed. None when no such rule is in force. OPA's rules cannot be read so: OPA
        decides the offer `mcp__<server>__*` itself (`Policy.decide`)."""
        name = document["tool"]["name"]
        if not self.rules or not name.endswith("*"):
            return None
        prefix = name[:-1]
        named = {**document, "tool": {**document["tool"], "kind": "mcp_tool"}}  # one of its tools, name unknown
        try:
            for rule in self.rules.rules:
                if rule.effect in ("allow", "label") or rule.mode != "enforce":
                    continue
                globs = (rule.when.tool,) if isinstance(rule.when.tool, str) else rule.when.tool or ("*",)
                reaching = [glob for glob in globs if any(c in glob for c in "*?[") and glob_reaches(glob, prefix)]
                if reaching and rule.when.model_copy(update={"tool": None}).holds(named, restricts=True):
                    return Decision(rule.effect, "rules", f"{rule.reason} (rule {rule.id} covers some of the server's "
                                    f"tools by the pattern {reaching[0]}, and which ones is not known before the "
                                    "model server lists them: only the tools named one by one and allowed are "
                                    "offered)", rule.id, self.revision)
        except Exception as exc:  # fail closed
            return Decision("deny", "policy", f"the policy could not be evaluated ({exc!r})", None, self.revision)
        return None

    def labels(self, document: dict[str, Any]) -> tuple[frozenset[str], tuple[str, ...]]:
        """The labels the YAML label rules give this call (the tool's own are the caller's to add), and those
        rules' ids. OPA gives none: a team that decides in Rego names a file of label rules with `--policy`."""
        return self.rules.labels(document) if self.rules else (frozenset(), ())

    def secrets_mode(self, document: dict[str, Any]) -> str | None:
        """The strictest `secrets:` (block > redact > allow) of the YAML rules that match this call; None when
        none says one (the tool's own, or the default, applies)."""
        return self.rules.secrets_mode(document) if self.rules else None

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


def _glob_tokens(glob: str) -> list[str]:
    """A glob as fnmatch reads it: `*`, or a pattern of one character each (`?`, a `[...]` set, a literal)."""
    tokens, at = [], 0
    while at < len(glob):
        end = at + 1
        if glob[at] == "[":
            close = glob.find("]", at + 1 + (glob[at + 1:at + 2] == "!") + 1)
            end = close + 1 if close != -1 else end
        tokens.append(glob[at:end])  # a lone `[` with no `]` after it is a literal, as fnmatch reads it
        at = end
    return tokens


def glob_reaches(glob: str, prefix: str) -> bool:
    """Whether `glob` matches some name that is `prefix` followed by at least one character: read `prefix` with it,
    and see whether any of the glob is left to read."""
    tokens = _glob_tokens(glob)

    def closure(states: set[int]) -> set[int]:  # a `*` may match nothing
        found = set(states)
        for at in sorted(states):
            while at < len(tokens) and tokens[at] == "*":
                at += 1
                found.add(at)
        return found

    states = closure({0})
    for character in prefix:
        states = closure({at if tokens[at] == "*" else at + 1 for at in states if at < len(tokens) and (
            tokens[at] == "*" or fnmatch.fnmatchcase(character, tokens[at]))})
    return any(at < len(tokens) for at in states)
