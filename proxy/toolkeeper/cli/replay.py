"""`toolkeeper policy replay`: the trail's calls decided again under candidate rules, before they ship.

    toolkeeper policy replay --candidate new-rules.yaml --since 7d [--tool Bash] [--format json]

The chain is verified first (a replay of an altered trail proves nothing);
then each recorded call's policy input is decided under the candidate
(policy/replay.py) and compared with what was decided then. Exit status 1
when a call the current policy allowed would be denied or asked about, or
may be (a candidate rule tests a value the trail redacted, so the call cannot
be judged from it), so a pipeline can hold back a rules change that would
stop today's traffic.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from toolkeeper.audit import SQLAudit
from toolkeeper.cli.audit import open_trail, since, trail_arguments
from toolkeeper.common import printable
from toolkeeper.policy import RulesError, load_rules, replay_trail, text_report

SHOWN = 200  # changed calls listed in text; JSON lists them all


def add_replay_parser(policy_commands: argparse._SubParsersAction) -> None:
    parser = policy_commands.add_parser("replay", parents=[trail_arguments()],
                                        help="decide the trail's recorded calls again under candidate rules and "
                                             "show what would change")
    parser.add_argument("--candidate", required=True, metavar="RULES", help="the candidate rules file (YAML)")
    parser.add_argument("--since", help="calls from this long ago (7d, 12h, 30m) or this ISO time")
    parser.add_argument("--until", help="calls until this long ago, or this ISO time")
    parser.add_argument("--tool", help="only calls of this tool")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or json")


def run_replay(args: argparse.Namespace) -> int:
    try:
        candidate = load_rules(args.candidate)
    except RulesError as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    window = {"since": since(args.since), "until": since(args.until, "--until"), "tool": args.tool}
    audit = open_trail(args)
    if audit is None:
        return 2
    try:
        return _replay(audit, candidate, window, args.format)
    finally:
        audit.close()


def _replay(audit: SQLAudit, candidate: object, window: dict, fmt: str) -> int:
    started = time.monotonic()
    what, report = replay_trail(audit, candidate, **window)  # type: ignore[arg-type]
    if report is None:
        print(f"toolkeeper: the trail does not verify, so a replay of it proves nothing: {printable(what)}",
              file=sys.stderr)
        return 2
    if fmt == "json":
        print(json.dumps({**report.as_json(), "chain": what}, indent=2, ensure_ascii=False))
    else:
        print(f"chain: {what}")
        print(text_report(report, SHOWN))
        print(f"\n({time.monotonic() - started:.1f} s)")
    return 1 if report.tightened or report.may_tighten else 0
