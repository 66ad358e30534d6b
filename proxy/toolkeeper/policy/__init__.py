"""Policy: one decision per call (allow, deny or ask), and who is asked.

Sources, the most restrictive wins: the security team's YAML rules, their OPA,
yolo and the tiers; any failure is a deny. An "ask" goes to a consent
channel: the terminal, the approvals store, or none. This layer knows nothing
of HTTP or of the tool loop.
"""

from toolkeeper.policy.approvals import ApprovalsConsent, arguments_hash
from toolkeeper.policy.consent import (
    RULE_SOURCES,
    Consent,
    ConsentAnswer,
    ConsentRequest,
    NoConsent,
    TerminalConsent,
    has_terminal,
    local_user,
)
from toolkeeper.policy.decision import Decision, Effect, most_restrictive
from toolkeeper.policy.opa import DEFAULT_PATH, OpaPolicy
from toolkeeper.policy.policy import Policy, policy_input, tier_decision
from toolkeeper.policy.rules import Rules, RulesError, default_rules_path, load_rules, rules_in_force

__all__ = [
    "DEFAULT_PATH",
    "RULE_SOURCES",
    "ApprovalsConsent",
    "Consent",
    "ConsentAnswer",
    "ConsentRequest",
    "Decision",
    "Effect",
    "NoConsent",
    "OpaPolicy",
    "Policy",
    "Rules",
    "RulesError",
    "TerminalConsent",
    "arguments_hash",
    "default_rules_path",
    "has_terminal",
    "load_rules",
    "local_user",
    "most_restrictive",
    "policy_input",
    "rules_in_force",
    "tier_decision",
]
