"""Who a call is for: the agent that sent it, and the person it acts for when a token says so.

The policy input's `principal` (docs/reference/policy-input.md) is this, as a
document: YAML rules and OPA read the same fields, and the record keeps them.
It never holds a raw token: only the claims the operator listed may reach a
rule (`auth.agents.jwt.claims`), each a short value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_CLAIM_CHARACTERS = 512  # a listed claim longer than this is cut: a rule reads names, not documents
MAX_GROUPS = 256


@dataclass(frozen=True)
class Principal:
    agent: str  # the agent's name: a listed key's, or the token's agent claim
    user: str | None = None  # the person the call acts for: the token's user claim, or a trusted identity header
    groups: tuple[str, ...] = ()
    issuer: str | None = None  # who vouched for the user (None: a static key, or a header from a trusted proxy)
    claims: dict[str, Any] = field(default_factory=dict)  # the operator's chosen claims, and only those

    def document(self) -> dict[str, Any]:
        return {"agent": self.agent, "user": self.user, "groups": list(self.groups), "issuer": self.issuer,
                "claims": dict(self.claims)}


def groups_of(value: Any) -> tuple[str, ...]:
    """A groups claim as a tuple of names: a list of strings, or one string (some providers send one group so)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(str(item) for item in value[:MAX_GROUPS] if isinstance(item, (str, int)))
    return ()


def chosen_claims(claims: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The listed claims of a token, each a scalar or a short list of scalars (anything else is left out)."""
    chosen: dict[str, Any] = {}
    for name in names:
        value = claims.get(name)
        if isinstance(value, str):
            chosen[name] = value[:MAX_CLAIM_CHARACTERS]
        elif isinstance(value, (bool, int, float)) or value is None:
            chosen[name] = value
        elif isinstance(value, list) and all(isinstance(item, (str, int, float, bool)) for item in value):
            chosen[name] = [str(item)[:MAX_CLAIM_CHARACTERS] if isinstance(item, str) else item
                            for item in value[:MAX_GROUPS]]
    return chosen
