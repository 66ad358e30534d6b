"""`toolkeeper policy import`: another agent's permission config as toolkeeper rules, and scenarios to test them.

    toolkeeper policy import claude-code .claude/settings.json -o rules.yaml --scenarios rules_scenarios.yaml
    toolkeeper policy import codex ~/.codex/rules/default.rules -o rules.yaml --shadow
    toolkeeper policy import gemini-cli ~/.gemini/policies/team.toml
    toolkeeper policy import .claude/settings.json        # the format told from the file

Each entry not translated exactly is said on stderr (`WARN <file>:<line> <entry>: <why>`) and at the top of
the rules. Exit 0: every entry translated exactly; 1: some were not (the rest is written all the same); 2: the
input cannot be read or is not valid in its own format.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkeeper.policy import (
    IMPORT_AGENT_FILE,
    IMPORT_FORMATS,
    PolicyImportError,
    import_policy,
    render_rules,
    render_scenarios,
)


def add_import_parser(policy_commands: argparse._SubParsersAction) -> None:
    parser = policy_commands.add_parser(
        "import", help="turn Claude Code's, Codex CLI's or Gemini CLI's permission config into rules and scenarios")
    parser.add_argument("source", nargs="+", metavar="[FORMAT] FILE",
                        help="the file to import, after its format when its name and content do not say it: "
                             "claude-code (a settings.json's permissions), codex (an execpolicy .rules file) or "
                             "gemini-cli (a policy .toml file)")
    parser.add_argument("-o", "--output", help="write the rules to this file (default: print them)")
    parser.add_argument("--scenarios", help="also write a scenario file for `toolkeeper policy test` (needs -o), "
                                            "and beside it the agent file it loads (NAME.agent.yaml)")
    parser.add_argument("--shadow", action="store_true",
                        help="give every rule `mode: shadow`: evaluated and recorded, deciding nothing, to try first")
    parser.add_argument("--project-dir",
                        help="claude-code: the project folder Claude Code runs in, where its /path and ./path rules "
                             "point (default: the folder holding .claude/, else the settings file's)")


def source_of(given: list[str]) -> tuple[str, str]:
    """(format, file) from `[FORMAT] FILE`: a format not given is told from the file (raises ValueError)."""
    if len(given) == 2:
        if given[0] not in IMPORT_FORMATS:
            raise ValueError(f"{given[0]!r} is no format toolkeeper imports ({', '.join(IMPORT_FORMATS)})")
        return given[0], given[1]
    if len(given) != 1:
        raise ValueError("give the file to import, after its format if need be: [FORMAT] FILE")
    path = Path(given[0])
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:65536]
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if path.suffix == ".json" or text.lstrip().startswith("{"):
        return "claude-code", given[0]
    if path.suffix == ".toml" or "[[rule]]" in text:
        return "gemini-cli", given[0]
    if path.suffix in (".rules", ".codexpolicy") or "prefix_rule" in text:
        return "codex", given[0]
    raise ValueError(f"{path}: cannot tell its format; say it first: {', '.join(IMPORT_FORMATS)}")


def run_import(args: argparse.Namespace) -> int:
    try:
        args.format, args.file = source_of(args.source)
    except ValueError as exc:
        return _fail(str(exc))
    if args.scenarios and not args.output:
        return _fail("--scenarios needs -o: the scenarios name the rules file they test")
    if args.project_dir and args.format != "claude-code":
        return _fail("--project-dir is for claude-code only")
    try:
        result = import_policy(args.format, args.file, project_dir=args.project_dir)
    except PolicyImportError as exc:
        return _fail(str(exc))
    for warning in result.warnings:
        print(f"WARN {warning}", file=sys.stderr)
    rules = render_rules(result, kind=args.format, source=args.file, shadow=args.shadow)
    try:
        if not args.output:
            sys.stdout.write(rules)
        else:
            Path(args.output).write_text(rules, encoding="utf-8")
        if args.scenarios:
            scenarios = Path(args.scenarios)
            agent_file = scenarios.with_name(f"{scenarios.stem}.agent.yaml")
            agent_file.write_text(IMPORT_AGENT_FILE, encoding="utf-8")
            scenarios.write_text(render_scenarios(result, scenarios_path=scenarios, rules_path=args.output,
                                                  agent_file=agent_file, shadow=args.shadow), encoding="utf-8")
    except OSError as exc:
        return _fail(f"{exc.filename}: cannot write it: {exc.strerror or exc}")
    written = f" to {args.output}" if args.output else ""
    tested = f", {len(result.scenarios)} scenarios to {args.scenarios}" if args.scenarios else ""
    exactly = f"; {len(result.warnings)} not translated exactly (WARN above)" if result.warnings else ""
    print(f"imported {len(result.rules)} rules{written}{tested}{exactly}", file=sys.stderr)
    return 1 if result.warnings else 0


def _fail(message: str) -> int:
    print(f"toolkeeper: {message}", file=sys.stderr)
    return 2
