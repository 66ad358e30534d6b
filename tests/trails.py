"""A trail of many recorded calls, written through toolkeeper's own audit trail, for replay's test and bench.

Each call's policy input is built by `policy_input` and decided by the rules
given, as serve would record them; the agent's own shell and file tools and a
declared tool, in a fixed rotation so a test knows which calls a candidate
changes. SQLite's fsync per write is turned off for the seeding only (20,000
writes would otherwise take minutes); the chain is the same.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

from toolkeeper.audit import ExecutionRecord, open_audit
from toolkeeper.policy import Policy, load_rules, policy_input

COMMANDS = ("git status", "ls -la src", "pytest -q tests", "curl -s https://example.com/install.sh -o install.sh",
            "npm run build && npm test", "rm -rf build", "grep -rn TODO src", "cat README.md | head -20",
            "sudo rm -rf /var/cache/x", "cat ~/.ssh/id_ed25519")
PATHS = ("/work/project/src/app.py", "/work/project/README.md", "/home/me/.aws/credentials", "/etc/hosts")
START = datetime(2026, 11, 1, 9, 0).astimezone()
# The rules the trail is decided by, and a candidate that denies one tool's argument (curl) and shadows another.
CURRENT_RULES = """
rules:
  - id: no-rm-rf
    effect: deny
    reason: Recursive forced deletion is not for agents.
    when: {source: agent, tool: Bash, arguments: {command: {runs: {program: rm, flags: [r, f]}}}}
  - id: no-credentials
    effect: deny
    reason: Credentials are off limits.
    when: {source: agent, tool: Read, arguments: {file_path: {under: ["~/.aws"]}}}
"""
CANDIDATE_RULES = CURRENT_RULES + """
  - id: no-downloads
    effect: deny
    reason: Downloads go through the mirror.
    when: {source: agent, tool: Bash, arguments: {command: {runs: {program: curl}}}}
  - id: ssh-keys-would-be-denied
    effect: deny
    mode: shadow
    reason: SSH keys.
    when: {source: agent, tool: Bash, arguments: {command: {runs: {under: ["~/.ssh"]}}}}
"""


def call_of(index: int) -> tuple[str, dict, str]:
    """The index-th call: (tool, arguments, source)."""
    if index % 3 == 2:
        return "Read", {"file_path": PATHS[index // 3 % len(PATHS)]}, "agent"
    if index % 7 == 6:
        return "lookup", {"query": f"item {index}"}, "mcp"
    return "Bash", {"command": COMMANDS[index % len(COMMANDS)]}, "agent"


def seed(trail: Path, count: int, rules: Path) -> list[str]:
    """Write `count` calls decided by `rules` into the SQLite trail at `trail`: their record ids, in order."""
    audit = open_audit(trail)
    audit.connection().execute("PRAGMA synchronous=OFF")
    policy = Policy(False, load_rules(rules))
    loop = asyncio.new_event_loop()
    ids = []
    try:
        for index in range(count):
            tool, arguments, source = call_of(index)
            now = START + timedelta(seconds=index)
            document = policy_input(tool, arguments, None, agent_id="a1b2c3", request_id=f"req{index}", now=now,
                                    source=source, tier="silent" if source == "mcp" else None,
                                    workdir="/work/project")
            decision = loop.run_until_complete(policy.decide(document))
            record = ExecutionRecord(time=now.timestamp(), request_id=f"req{index}", agent="a1b2c3", tool=tool,
                                     source=source, api="hook", arguments_sent=arguments, arguments=arguments,
                                     policy_input=document, runner="mcp" if source == "mcp" else "")
            record.decided_by(decision)
            if decision.effect == "allow":
                record.status = "forwarded"
                audit.forwarded(record)
            else:
                record.status, record.answer = "denied", f"Not allowed by toolkeeper: {decision.reason}"
                audit.refused(record)
            ids.append(record.record_id)
    finally:
        loop.close()
        audit.close()
    return ids
