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
from toolkeeper.policy.flows import SECRETS_MODES, empty_session
from toolkeeper.policy.imports import (
    IMPORT_AGENT_FILE,
    IMPORT_FORMATS,
    ImportResult,
    PolicyImportError,
    import_policy,
    render_rules,
    render_scenarios,
)
from toolkeeper.policy.limits import Limit, amount_text, window_text, with_limits
from toolkeeper.policy.limits import assess as assess_limits
from toolkeeper.policy.limits import on_call as limits_on_call
from toolkeeper.policy.opa import DEFAULT_PATH, OpaPolicy
from toolkeeper.policy.policy import Policy, policy_input, tier_decision
from toolkeeper.policy.replay import Replayed, Report, current_effect, replay_calls, replay_trail, text_report
from toolkeeper.policy.rulefiles import default_rules_path, load_rules, rules_in_force
from toolkeeper.policy.rules import Rules, RulesError
from toolkeeper.policy.secret_modes import DEFAULT_MODE as SECRETS_DEFAULT
from toolkeeper.policy.secret_modes import Guarded, scan_arguments, withheld_notice
from toolkeeper.policy.secret_modes import guard as guard_result
from toolkeeper.policy.secret_modes import scan as scan_result
from toolkeeper.policy.secret_modes import strictest as strictest_secrets
from toolkeeper.policy.secrets import KINDS as SECRET_KINDS
from toolkeeper.policy.secrets import Finding as SecretFinding
from toolkeeper.policy.secrets import Redaction
from toolkeeper.policy.secrets import find as find_secrets
from toolkeeper.policy.secrets import prepare as prepare_secrets
from toolkeeper.policy.secrets import redact as redact_secrets
from toolkeeper.policy.secrets import redaction as secrets_redaction
from toolkeeper.policy.secrets import scrub as scrub_secrets

__all__ = [
    "DEFAULT_PATH",
    "IMPORT_AGENT_FILE",
    "IMPORT_FORMATS",
    "RULE_SOURCES",
    "SECRETS_DEFAULT",
    "SECRETS_MODES",
    "SECRET_KINDS",
    "ApprovalsConsent",
    "Consent",
    "ConsentAnswer",
    "ConsentRequest",
    "Decision",
    "Effect",
    "Guarded",
    "ImportResult",
    "Limit",
    "NoConsent",
    "OpaPolicy",
    "Policy",
    "PolicyImportError",
    "Redaction",
    "Replayed",
    "Report",
    "Rules",
    "RulesError",
    "SecretFinding",
    "TerminalConsent",
    "amount_text",
    "arguments_hash",
    "assess_limits",
    "commands_in",
    "current_effect",
    "default_rules_path",
    "empty_session",
    "find_secrets",
    "four_eyes_refusal",
    "guard_result",
    "has_terminal",
    "import_policy",
    "limits_on_call",
    "load_rules",
    "local_user",
    "most_restrictive",
    "policy_input",
    "prepare_secrets",
    "redact_secrets",
    "render_rules",
    "render_scenarios",
    "replay_calls",
    "replay_trail",
    "rules_in_force",
    "same_person",
    "scan_arguments",
    "scan_result",
    "scrub_secrets",
    "secrets_redaction",
    "strictest_secrets",
    "text_report",
    "tier_decision",
    "window_text",
    "with_limits",
    "withheld_notice",
]
