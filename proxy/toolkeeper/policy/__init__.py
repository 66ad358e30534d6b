"""Policy: one decision per call (allow, deny or ask), and who is asked.

Sources, the most restrictive wins: the security team's YAML rules, their OPA,
yolo and the tiers; any failure is a deny. An "ask" goes to a consent
channel: the terminal, the approvals store, or none. This layer knows nothing
of HTTP or of the tool loop.
"""

from toolkeeper.policy.approvals import ApprovalsConsent, arguments_hash, four_eyes_refusal, same_person
from toolkeeper.policy.conditions import commands_in
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
from toolkeeper.policy.imports import (
    IMPORT_AGENT_FILE,
    IMPORT_FORMATS,
    ImportResult,
    PolicyImportError,
    import_policy,
    render_rules,
    render_scenarios,
)
from toolkeeper.policy.opa import DEFAULT_PATH, OpaPolicy
from toolkeeper.policy.policy import Policy, policy_input, tier_decision
from toolkeeper.policy.replay import Replayed, Report, current_effect, replay_calls, replay_trail, text_report
from toolkeeper.policy.rules import Rules, RulesError, default_rules_path, load_rules, rules_in_force

__all__ = [
    "DEFAULT_PATH",
    "IMPORT_AGENT_FILE",
    "IMPORT_FORMATS",
    "RULE_SOURCES",
    "ApprovalsConsent",
    "Consent",
    "ConsentAnswer",
    "ConsentRequest",
    "Decision",
    "Effect",
    "ImportResult",
    "NoConsent",
    "OpaPolicy",
    "Policy",
    "PolicyImportError",
    "Replayed",
    "Report",
    "Rules",
    "RulesError",
    "TerminalConsent",
    "arguments_hash",
    "commands_in",
    "current_effect",
    "default_rules_path",
    "four_eyes_refusal",
    "has_terminal",
    "import_policy",
    "load_rules",
    "local_user",
    "most_restrictive",
    "policy_input",
    "render_rules",
    "render_scenarios",
    "replay_calls",
    "replay_trail",
    "rules_in_force",
    "same_person",
    "text_report",
    "tier_decision",
]
