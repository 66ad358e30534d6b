"""The docs' example rules, read from the pages as written and run as scenarios (a call in, the decision out,
with the evasions that matter and the near misses that must pass), and the security how-to's OPA offline path.

A page marks its example rules ```yaml rules```, its scenario files ```yaml scenarios```, and the reference's
listing of every condition ```yaml rules-syntax``` (loaded, not run). A block's first line may name the file it
is (`# policies/team.yaml`; a bare name sits beside the example agent file). A doc rule with the id of one of
policies/coding-agents.yaml's must be that rule exactly, so that the docs show what ships.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from test_docs import BLOCK, blocks, stop_group

from toolkeeper.policy import load_rules

RULE_PAGES = ["docs/how-to/govern-the-agents-own-tools.md", "docs/how-to/security-team.md"]
# pages that show shipped rules among examples that are meant to fail (a regular expression's evasions)
COPYING_PAGES = [*RULE_PAGES, "docs/how-to/write-rules-for-shell-and-file-tools.md"]
SYNTAX_PAGE = "docs/reference/policy-rules.md"
SHIPPED = ROOT / "policies" / "coding-agents.yaml"
NAMED_FILE = re.compile(r"#\s*([\w./-]+\.yaml)")


def marked(page: str, mark: str) -> list[str]:
    """The bodies of the page's ```yaml MARK``` blocks, in order."""
    return [body for language, info, body in BLOCK.findall((ROOT / page).read_text())
            if language == "yaml" and mark in info.split()]


def rule_blocks() -> list[tuple[str, int, str]]:
    return [(page, index, body) for page in RULE_PAGES for index, body in enumerate(marked(page, "rules"))]


def example_folder(tmp_path: Path) -> Path:
    """A folder shaped like the checkout where a page's files land: the example agent, and policies/."""
    shutil.copytree(ROOT / "declared", tmp_path / "declared")
    (tmp_path / "policies").mkdir()
    return tmp_path


def place(folder: Path, body: str, default: str) -> Path:
    """Where a block's first-line comment says it lives (a bare name: beside the example agent file)."""
    named = NAMED_FILE.match(body.lstrip())
    name = named.group(1) if named else default
    path = folder / name if "/" in name else folder / "declared" / "example" / name
    path.write_text(body)
    return path


def run_scenarios(path: Path) -> str:
    """`toolkeeper policy test` on a scenario file: every scenario passes, and no rule is warned about."""
    run = subprocess.run([sys.executable, "-m", "toolkeeper", "policy", "test", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=path.parent)
    failures = [line for line in run.stdout.splitlines() if not line.startswith("PASS")]
    assert run.returncode == 0 and " 0 failed" in run.stdout, "\n".join(failures) + run.stderr
    warnings = [line for line in run.stdout.splitlines() if line.startswith("WARN")]
    assert not warnings, "\n".join(warnings)
    return run.stdout


# The scenarios of every doc rule, by its id: (call, situation, expected decision); a deny or ask names the rule.
Scenario = tuple[dict, dict, str]


def agent(tool: str, arguments: dict, expect: str, kind: str = "function", workdir: str | None = None) -> Scenario:
    return {"tool": tool, "source": "agent", "kind": kind, "arguments": arguments}, \
        ({"workdir": workdir} if workdir else {}), expect


def patch(path: str, verb: str = "Update File") -> str:
    return f"*** Begin Patch\n*** {verb}: {path}\n@@\n-a\n+b\n*** End Patch\n"


def release(channel: str, at: str, header: str | None = None) -> dict:
    situation: dict = {"at": at, "yolo": True}
    if header:
        situation["agent"] = {"header": header}
    return {"tool": "release", "arguments": {"version": "1.4.2", "channel": channel}}, situation


FRIDAY, THURSDAY = "2026-11-27T10:00:00+00:00", "2026-11-26T10:00:00+00:00"
DELETES_EVERYTHING = [  # each way of writing it that the rules must catch
    "rm -rf /", "rm -r -f /", "rm -fr /", "rm -Rf ~", "rm --recursive --force /", "/bin/rm -rf /",
    "sudo rm -rf --no-preserve-root /", "cd /tmp;rm -rf ~", "make clean && rm -rf $HOME", "yes | rm -rf /*",
    "rm \t -rf  \t /", 'rm -rf "${HOME}"', "rm -rf '/'", "rm build / -rf", "\\rm -rf ~/", "x=$(rm -rf /)",
]
DELETES_SOMETHING = [  # near misses that must pass
    "rm -r build/", "rm -rf build", "rm -rf /tmp/build /var/tmp/cache", "rm -f notes.txt", "ls -rf /",
    "farm -rf /", "rm -rf node_modules && ls /", "grep -rn 'rm -rf' docs/",
]
DELETES_OUTSIDE = [  # (command, working directory): recursive deletes out of the project
    ("rm -rf ../..", "/home/me/proj"), ("rm -rf ../other", "/home/me/proj"), ("find .. -delete", "/home/me/src/p"),
    ("rm -r /srv/data", "/home/me/proj"), ("cd /srv && rm -rf data", "/home/me/proj"),
    ("rm -rf ~/project/dist", None), ("sudo rm -rf /opt/app", None), ("rm -rf $HOME/other", "/home/me/proj"),
]
DELETES_INSIDE = [
    ("rm -rf build", None), ("rm -rf ./dist node_modules", None), ("rm -rf build 2>/dev/null", "/home/me/proj"),
    ("rm -rf /home/me/proj/dist", "/home/me/proj"), ("rm -rf /tmp/build /var/tmp/x", None),
    ("find . -name '*.o' -delete", "/home/me/proj"), ("rm -f ../notes.txt", "/home/me/proj"),
]
SYSTEM_PATHS = ["/etc/hosts", "//etc/hosts", "/./etc/sudoers", "/home/me/../../usr/bin/ls", "/boot/grub/grub.cfg"]
MORE_SYSTEM_PATHS = [*SYSTEM_PATHS, "/sbin/init", "/lib/systemd/x.service", "/private/etc/hosts", "/Library/x.plist"]
PROJECT_PATHS = ["/home/me/project/etc/app.conf", "/home/me/project/src/main.py", "/tmp/etc-notes.md"]
PATCHED_NEVER = ["/etc/hosts", "//etc/hosts", "../../../../../../etc/passwd", ".env", "app/.env",
                 "/home/me/.ssh/authorized_keys", "/home/me/.aws/credentials"]
PATCHED_FINE = ["src/etc/config.py", ".env.example", "notes.md", "docs/env.md"]
PUSHES = ["git push", "cd repo && git push origin main", "git -C repo push", "git -c push.default=current push",
          "git\tpush --force", "make; git push"]
NOT_PUSHES = ["git status", "git stash push", "git log --grep push", "echo pushed"]

SCENARIOS: dict[str, list[Scenario]] = {
    "agent-delete-everything-never": [
        agent(tool, {"command": command}, "deny") for tool in ("Bash", "shell_command") for command in DELETES_EVERYTHING
    ] + [agent("exec_command", {"cmd": command}, "deny") for command in DELETES_EVERYTHING]
    + [agent("Bash", {"command": command}, "allow") for command in DELETES_SOMETHING]
    + [agent("exec_command", {"cmd": command}, "allow") for command in DELETES_SOMETHING],
    "agent-delete-outside-project-never": [
        agent(tool, {name: command}, "deny", workdir=workdir)
        for tool, name in (("Bash", "command"), ("exec_command", "cmd")) for command, workdir in DELETES_OUTSIDE
    ] + [agent("local_shell", {"action": {"command": ["rm", "-rf", "../x"]}}, "deny", "local_shell_call", "/home/a/p")]
    + [agent("Bash", {"command": command}, "allow", workdir=workdir) for command, workdir in DELETES_INSIDE],
    "builtin-shell-delete-everything-never": [
        agent("shell", {"action": {"commands": ["ls", command]}}, "deny", "shell_call") for command in DELETES_EVERYTHING
    ] + [agent("shell", {"action": {"commands": [command]}}, "allow", "shell_call") for command in DELETES_SOMETHING],
    "agent-file-system-files-never": [
        agent(tool, {"file_path": path}, "deny") for tool in ("Edit", "Write", "MultiEdit") for path in MORE_SYSTEM_PATHS
    ] + [agent("NotebookEdit", {"notebook_path": path}, "deny") for path in MORE_SYSTEM_PATHS]
    + [agent("Edit", {"file_path": path}, "allow") for path in PROJECT_PATHS]
    + [agent("NotebookEdit", {"notebook_path": path}, "allow") for path in PROJECT_PATHS]
    + [agent("Read", {"file_path": "/etc/hosts"}, "allow")],
    "codex-patch-credentials-and-system-files-never": [
        agent("apply_patch", {"input": patch(path)}, "deny", "custom_tool_call") for path in PATCHED_NEVER
    ] + [agent("apply_patch", {"command": patch(path)}, "deny", workdir="/home/me/p") for path in PATCHED_NEVER]
    + [agent("apply_patch", {"input": patch("/etc/cron.d/job", "Add File")}, "deny"),
       agent("apply_patch", {"input": patch("old.sh") + "*** Move to: /usr/local/bin/x\n"}, "deny"),
       agent("exec_command", {"cmd": f"apply_patch <<'EOF'\n{patch('/etc/hosts')}EOF"}, "deny")]
    + [agent("apply_patch", {"input": patch(path)}, "allow", "custom_tool_call") for path in PATCHED_FINE]
    + [agent("apply_patch", {"command": patch(path)}, "allow", workdir="/home/me/p") for path in PATCHED_FINE],
    "builtin-patch-credentials-and-system-files-never": [
        agent("apply_patch", {"operation": {"type": "update_file", "path": path, "diff": "+x"}}, "deny",
              "apply_patch_call") for path in [*SYSTEM_PATHS, "/home/me/.ssh/config", "~/.aws/credentials"]
    ] + [agent("apply_patch", {"operation": {"type": "create_file", "path": path, "diff": "+x"}}, "allow",
               "apply_patch_call") for path in PATCHED_FINE],
    "pushes-ask": [agent(tool, {"command": command}, "ask") for tool in ("Bash", "shell_command") for command in PUSHES]
    + [agent("Bash", {"command": command}, "allow") for command in NOT_PUSHES],
    "freeze-stable-on-friday": [(*release("stable", FRIDAY), "deny"), (*release("beta", FRIDAY), "allow"),
                                (*release("stable", THURSDAY), "allow")],
    "payments-agents-ask-before-any-release": [
        (*release("beta", THURSDAY, "team-payments/bot"), "ask"),
        (*release("beta", THURSDAY, "team-billing/bot"), "allow"),
        (*release("beta", THURSDAY, "x-team-payments/bot"), "allow"),
    ],
    "no-web-search": [({"tool": "web_search", "source": "hosted", "kind": "web_search"}, {}, "deny"),
                      ({"tool": "file_search", "source": "hosted", "kind": "file_search"}, {}, "allow")],
    "no-repo-deletes": [
        ({"tool": "mcp__github__delete_repo", "source": "hosted", "kind": "mcp_approval_request"}, {}, "deny"),
        ({"tool": "mcp__github__get_issue", "source": "hosted", "kind": "mcp_approval_request"}, {}, "allow"),
        ({"tool": "mcp__gitlab__delete_repo", "source": "hosted", "kind": "mcp_approval_request"}, {}, "allow"),
    ],
}


def scenario_file(folder: Path, rules: Path, ids: list[str]) -> Path:
    """The scenarios of these rules, as `toolkeeper policy test` reads them, against the example agent."""
    scenarios = []
    for rule_id in ids:
        for number, (call, situation, expect) in enumerate(SCENARIOS[rule_id]):
            said = call.get("arguments") or situation.get("agent") or ""
            scenario = {"name": f"{rule_id} #{number}: {call['tool']} {said}", "call": call, **situation,
                        "expect": expect}
            if expect != "allow":
                scenario["rule"] = rule_id
            scenarios.append(scenario)
    path = folder / "policies" / f"{rules.stem}_doc_scenarios.yaml"
    path.write_text(yaml.safe_dump({"agent_file": str(folder / "declared" / "example" / "agent.yaml"),
                                    "policy": str(rules), "scenarios": scenarios}, sort_keys=False))
    return path


def ids_of(body: str) -> list[str]:
    return [rule["id"] for rule in yaml.safe_load(body)["rules"]]


@pytest.mark.parametrize(("page", "index", "body"), rule_blocks(), ids=[f"{p}#{i}" for p, i, _ in rule_blocks()])
def test_each_doc_rule_holds_against_its_evasions_and_near_misses(tmp_path, page, index, body):
    folder = example_folder(tmp_path)
    rules = place(folder, body, f"rules{index}.yaml")
    untested = [rule_id for rule_id in ids_of(body) if rule_id not in SCENARIOS]
    assert not untested, f"{page}: rules with no scenario here: {untested}"
    for rule_id in ids_of(body):  # each rule decides at least one call itself, and lets a near miss through
        assert {expect for _, _, expect in SCENARIOS[rule_id]} >= {"allow"}, rule_id
        assert any(expect != "allow" for _, _, expect in SCENARIOS[rule_id]), rule_id
    printed = run_scenarios(scenario_file(folder, rules, ids_of(body)))
    assert f"{sum(len(SCENARIOS[i]) for i in ids_of(body))} passed, 0 failed" in printed


@pytest.mark.parametrize("page", RULE_PAGES)
def test_the_pages_own_scenarios_pass_against_their_rules(tmp_path, page):
    folder = example_folder(tmp_path)
    for index, body in enumerate(marked(page, "rules")):
        place(folder, body, f"rules{index}.yaml")
    scenario_blocks = marked(page, "scenarios")
    assert scenario_blocks, f"{page} shows no scenario file"
    for body in scenario_blocks:
        run_scenarios(place(folder, body, "scenarios.yaml"))


def test_a_doc_rule_named_as_a_shipped_one_is_that_rule_exactly():
    shipped = {rule["id"]: rule for rule in yaml.safe_load(SHIPPED.read_text())["rules"]}
    copied = 0
    for page, body in ((page, body) for page in COPYING_PAGES for body in marked(page, "rules")):
        for rule in yaml.safe_load(body)["rules"]:
            if rule["id"] in shipped:
                assert rule == shipped[rule["id"]], f"{page}: {rule['id']} differs from policies/coding-agents.yaml"
                copied += 1
    assert copied >= 6  # the delete, edit and patch rules of both how-tos


def test_every_rules_block_in_the_docs_is_marked_and_loads(tmp_path):
    """An unmarked example rule would escape these tests: every YAML block holding `rules:` is marked."""
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for language, info, body in BLOCK.findall(page.read_text()):
            if language == "yaml" and re.search(r"^rules:", body, re.M):
                words = info.split()
                assert "rules" in words or "rules-syntax" in words, f"{page}: an unmarked rules block"
                path = tmp_path / "rules.yaml"
                path.write_text(body)
                assert load_rules(path).rules, f"{page}: the block loads no rule"
    assert marked(SYNTAX_PAGE, "rules-syntax"), "the reference lists no condition"


def test_the_security_how_to_runs_opa_offline_as_written(tmp_path):
    """The OPA offline path of the security how-to, from a copy of the checkout's policies, example agent and
    OPA stand-in, run as tests/test_docs.py runs a page."""
    _, scripts, outputs = blocks(ROOT / "docs/how-to/security-team.md")
    assert scripts and outputs, "the security how-to has no offline path"
    for part in ("policies", "declared"):
        shutil.copytree(ROOT / part, tmp_path / part)
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "opa_server.py", tmp_path / "tests")
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        process = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + "\n".join(scripts)], cwd=tmp_path,
                                   env=environment, stdout=out, stderr=err, start_new_session=True)
        try:
            process.wait(120)
        finally:
            stop_group(process.pid)  # the stand-in, were the page's own `kill` not reached
            process.wait()
    printed, said = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert process.returncode == 0, f"{printed}\n{said}"
    for line in outputs:
        assert line in printed, f"{line!r} not printed:\n{printed}\n{said}"
