"""Writing good tools: `toolkeeper schema` (what the model receives), `toolkeeper check` (a lint read as the model
reads), `toolkeeper model` (the scripted model, for a first run with no model at all)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from toolkeeper.common import counted


def add_parser(commands: argparse._SubParsersAction) -> None:
    schema = commands.add_parser("schema", help="print the tool entries the model receives, as one JSON array")
    schema.add_argument("agent_file", help="the agent file (YAML)")
    schema.add_argument("--style", choices=("plain", "standard"), help="override the file's `schema:`")
    schema.add_argument("--api", choices=("chat", "responses", "messages", "mcp"), default="chat",
                        help="the shape of the API the agent speaks (default chat; mcp: as `tools/list` gives them)")
    schema.set_defaults(run=schema_command)

    check = commands.add_parser("check", help="lint an agent file as the model will read it")
    check.add_argument("agent_file", help="the agent file (YAML)")
    check.add_argument("--policy", metavar="RULES", help="also check the security team's YAML rules against it, "
                       "and say what an agent's hook is answered for a call they do not decide")
    check.add_argument("--config", metavar="FILE", help="serve's config file, for the settings serve would apply "
                       "with the rules (hooks_undecided; default: $TOOLKEEPER_CONFIG)")
    check.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or json")
    check.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    check.set_defaults(run=check_command)

    model = commands.add_parser("model", help="serve the scripted model (Chat Completions, Responses, Messages) "
                                              "for a first run without a model")
    model.add_argument("--script", required=True, metavar="FILE",
                       help="a JSON or YAML list of steps, each with `content` and/or `tool_calls`")
    model.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    model.add_argument("--port", type=int, default=8700, help="the port to listen on (default 8700; 0 picks one)")
    model.set_defaults(run=model_command)


def schema_command(args: argparse.Namespace) -> int:
    from toolkeeper.tools import AgentFileError, load_agent_file, mcp_tool, offered_schemas
    from toolkeeper.wire import anthropic_tool, flat_tool

    try:
        agent = load_agent_file(args.agent_file, serving=False)
    except AgentFileError as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    entries = offered_schemas(agent, args.style)
    shape = {"chat": lambda entry: entry, "responses": flat_tool, "messages": anthropic_tool, "mcp": mcp_tool}[args.api]
    print(json.dumps([shape(entry) for entry in entries], indent=2, ensure_ascii=False))
    return 0


def check_command(args: argparse.Namespace) -> int:
    from toolkeeper.settings import Settings, describe_hooks_undecided
    from toolkeeper.tools import Finding

    # what serve would answer an agent's hook for a call the rules leave undecided: read where serve reads it
    undecided = Settings.for_command(args).hooks_undecided if args.policy else None
    findings = findings_for(args.agent_file, args.policy)
    errors = sum(finding.severity == "error" for finding in findings)
    warnings = len(findings) - errors
    if args.format == "json":
        report = {"file": args.agent_file, "errors": errors, "warnings": warnings,
                  "findings": [finding.as_dict() for finding in findings]}
        print(json.dumps({**report, "hooks_undecided": undecided} if undecided else report, indent=2))
    else:
        for finding in findings:
            print(f"{args.agent_file}: {Finding.line(finding)}")
        if undecided:
            print(f"{args.policy}: {describe_hooks_undecided(undecided)}")
        print(f"{args.agent_file}: {counted(errors, 'error')}, {counted(warnings, 'warning')}")
    return 1 if errors or (warnings and args.strict) else 0


def findings_for(agent_file: str, policy: str | None) -> list:
    """The lint's findings; a file that does not load is one finding (E000), as are rules that do not (R000)."""
    from toolkeeper.policy import RulesError, load_rules
    from toolkeeper.tools import AgentFileError, Finding, lint_agent, load_agent_file

    try:
        agent = load_agent_file(agent_file, serving=False)
    except AgentFileError as exc:
        return [Finding("E000", "error", None, None, f"the file does not load: {exc}", "correct what it names")]
    findings = lint_agent(agent)
    if policy:
        try:
            rules = load_rules(policy)
        except RulesError as exc:
            return [*findings, Finding("R000", "error", None, None, f"the rules do not load: {exc}",
                                       "correct what it names")]
        findings += [Finding(code, "warning", None, f"rules.{rule_id}", text, RULE_FIXES.get(code, RULE_FIX))
                     for code, rule_id, text in rules.problems(agent)]
    return findings


RULE_FIX = "name what the agent file declares, or say `source: agent`"
RULE_FIXES = {"R004": "test no argument (the tool is withheld whole), or make it `mode: shadow`, which is tried on "
                      "the calls the server ran, with their arguments"}


def model_command(args: argparse.Namespace) -> int:
    from toolkeeper.scripted import run_scripted

    try:
        steps = read_script(Path(args.script))
    except (OSError, ValueError) as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    return run_scripted(steps, args.host, args.port, f" ({len(steps)} steps from {args.script})")


def read_script(path: Path) -> list[dict]:
    """A JSON or YAML list of steps; each a mapping (`content`, `tool_calls`, ...)."""
    import yaml

    try:
        steps = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: neither JSON nor YAML: {exc}") from None
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise ValueError(f"{path}: a script is a list of steps, each a mapping with `content` and/or `tool_calls`")
    return steps
