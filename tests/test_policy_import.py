"""`toolkeeper policy import`: Claude Code's, Codex CLI's and Gemini CLI's permission configs as rules.

Each sample under tests/policies/ goes through the real command; the rules it writes must load, the warnings
must name every entry not translated exactly, and the scenarios it writes (each example's decision as the
original config makes it) must pass under `toolkeeper policy test`, enforced and in shadow mode. A few calls
the samples do not show (compound commands, paths written otherwise) check the rules as toolkeeper reads them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_cli

from toolkeeper.policy import load_rules

SAMPLES = ROOT / "tests" / "policies"
CLAUDE, CODEX, GEMINI = (SAMPLES / "import_claude_settings.json", SAMPLES / "import_codex.rules",
                         SAMPLES / "import_gemini.toml")


def imported(tmp_path: Path, kind: str, source: Path, *options: str):
    """Run the import into tmp_path: (the process, the rules file, the scenarios file)."""
    rules, scenarios = tmp_path / f"{kind}.yaml", tmp_path / f"{kind}_scenarios.yaml"
    run = run_cli("policy", "import", kind, str(source), "-o", str(rules), "--scenarios", str(scenarios), *options)
    assert "Traceback" not in run.stderr, run.stderr
    return run, rules, scenarios


def warnings(run) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("WARN ")]


def passes(scenarios: Path, count: int | None = None) -> str:
    """`toolkeeper policy test` on the file: exit 0, every scenario PASS, no warning about the rules."""
    run = run_cli("policy", "test", str(scenarios))
    lines = run.stdout.splitlines()
    failed = [line for line in lines if not line.startswith(("PASS", "scenarios:"))]
    assert run.returncode == 0 and not failed, "\n".join(failed) + run.stderr
    if count is not None:
        assert f"scenarios: {count} passed, 0 failed" in run.stdout, run.stdout
    return run.stdout


def rules_of(path: Path) -> dict[str, dict]:
    return {rule["id"]: rule for rule in yaml.safe_load(path.read_text())["rules"]}


def add_scenarios(scenarios: Path, extra: list[dict]) -> None:
    """More calls against the same rules, beside the generated ones."""
    spec = yaml.safe_load(scenarios.read_text())
    spec["scenarios"] += extra
    scenarios.write_text(yaml.safe_dump(spec, sort_keys=False))


def call(tool: str, expect: str, rule: str | None = None, kind: str | None = None, **arguments) -> dict:
    scenario = {"name": f"{tool} {arguments} -> {expect}", "call": {"tool": tool, "source": "agent",
                                                                    "arguments": arguments}, "expect": expect}
    if kind:
        scenario["call"]["kind"] = kind
    if rule:
        scenario["rule"] = rule
    return scenario


def test_claude_code_settings_become_rules_that_decide_as_claude_code_does(tmp_path):
    run, rules_path, scenarios = imported(tmp_path, "claude-code", CLAUDE)
    assert run.returncode == 1, run.stderr  # some entries are approximate or not translated: said, not dropped
    said = "\n".join(warnings(run))
    for entry in ('deny "Task(Explore)": toolkeeper has no translation', "permissions.defaultMode",
                  "permissions.additionalDirectories", 'deny "Read(./secrets/*.pem)": approximate',
                  'deny "Bash(docker run * --privileged)": approximate', 'ask "Bash(npm run build*)": approximate'):
        assert entry in said, said
    assert re.search(r'^WARN import_claude_settings\.json:28 deny "Task\(Explore\)"', said, re.M)
    assert len(warnings(run)) == 6
    text = rules_path.read_text()
    assert text.startswith("# Imported by `toolkeeper policy import claude-code`")
    assert text.count("\n# WARN ") == 6
    assert len(load_rules(rules_path).rules) == 24
    rules = rules_of(rules_path)
    assert rules["claude-allow-bash-npm-run-test"]["when"]["arguments"] == {
        "command": {"runs": {"prefix": ["npm", "run", "test"]}}}
    assert rules["claude-allow-bash-git-diff"]["when"]["arguments"]["command"] == {"runs": {"prefix": ["git", "diff"]}}
    assert rules["claude-deny-read-ssh"]["when"] == {"source": "agent", "tool": "Read",
                                                     "arguments": {"file_path": {"under": ["~/.ssh"]}}}
    assert rules["claude-deny-read-ssh-glob-grep"]["when"]["tool"] == ["Glob", "Grep"]
    assert rules["claude-deny-write-etc"]["when"]["arguments"] == {"file_path": {"under": ["/etc"]}}
    assert rules["claude-allow-edit-src"]["when"]["arguments"] == {"file_path": {"under": [f"{SAMPLES}/src"]}}
    assert rules["claude-allow-edit-src"]["when"]["tool"] == ["Edit", "MultiEdit", "Write"]
    assert rules["claude-deny-mcp-github-delete-repo"]["when"] == {"tool": "mcp__github__delete_repo"}
    assert rules["claude-ask-mcp-jira"]["when"] == {"tool": "mcp__jira__*"}
    assert rules["claude-deny-bash-rm-rf"]["reason"] == "Imported from import_claude_settings.json: deny Bash(rm -rf:*)"
    assert all(rule["when"].get("source") == "agent" for name, rule in rules.items() if "-mcp-" not in name)
    passes(scenarios, 24)


def test_claude_code_rules_catch_what_the_settings_name_however_it_is_written(tmp_path):
    _, _, scenarios = imported(tmp_path, "claude-code", CLAUDE)
    home, project = str(Path.home()), str(SAMPLES)
    add_scenarios(scenarios, [
        call("Bash", "deny", "claude-deny-bash-rm-rf", command="cd /tmp && rm -rf build"),
        call("Bash", "deny", "claude-deny-bash-rm-rf", command="echo start; rm -rf ~/old | tee log"),
        call("Bash", "allow", command="rm -r build"),
        call("Bash", "ask", "claude-ask-bash-git-push", command="git status && git push origin main"),
        call("Bash", "allow", "claude-allow-bash-npm-run-test", command="npm run test -- --watch"),
        call("Bash", "allow", command="npm run test:unit"),  # `npm run test:*` is the word test, then arguments
        call("Bash", "ask", "claude-ask-bash-npm-run-build", command="npm run build:prod"),
        call("Bash", "deny", "claude-deny-bash-docker-run-privileged", command="docker run --rm -it ubuntu --privileged"),
        call("Bash", "allow", command="docker run ubuntu"),
        call("Bash", "allow", "claude-allow-bash-git-status", command="git  status"),
        call("Read", "deny", "claude-deny-read-ssh", file_path=f"{home}/.ssh/id_ed25519"),
        call("Read", "deny", "claude-deny-read-ssh", file_path="~/.ssh/../.ssh/config"),
        call("Grep", "deny", "claude-deny-read-ssh-glob-grep", path="~/.ssh"),
        call("Read", "allow", file_path=f"{home}/.sshd_config"),
        call("Read", "deny", "claude-deny-read-env", file_path=f"{project}/app/.env"),
        call("Read", "allow", file_path=f"{project}/.env.example"),
        call("Read", "deny", "claude-deny-read-secrets-pem", file_path=f"{project}/secrets/tls.pem"),
        call("Read", "allow", file_path=f"{project}/secrets/README.md"),
        call("Write", "deny", "claude-deny-write-etc", file_path="//etc/./hosts"),
        call("Write", "deny", "claude-deny-write-etc", file_path="/tmp/../etc/passwd"),
        call("Edit", "allow", file_path="/etc/hosts"),  # Write(//etc/**) names the Write tool alone
        call("Edit", "allow", "claude-allow-edit-src", file_path=f"{project}/src/app/main.py"),
        call("WebFetch", "deny", "claude-deny-webfetch-evil-example", url="https://cdn.evil.example/x.js"),
        call("WebFetch", "allow", url="https://evil.example.attacker.test/"),
        call("WebFetch", "allow", url="https://docs.python.org.attacker.test/"),  # not docs.python.org: no allow
        call("WebFetch", "allow", "claude-allow-webfetch-docs-python-org", url="https://DOCS.python.org:443/3/"),
        call("mcp__github__delete_repo", "deny", "claude-deny-mcp-github-delete-repo"),
        call("mcp__jira__create_issue", "ask", "claude-ask-mcp-jira"),
        call("mcp__jiralike__x", "allow"),
    ])
    passes(scenarios)


def test_codex_prefix_rules_become_one_rule_per_codex_shell_tool(tmp_path):
    run, rules_path, scenarios = imported(tmp_path, "codex", CODEX)
    assert run.returncode == 1, run.stderr
    assert warnings(run) == [
        'WARN import_codex.rules:28 host_executable(name = "git", paths = ["/usr/bin/git", "/opt/homebrew/bin/git"]): '
        "not translated: toolkeeper's rules read the program as the command names it, and do not check which "
        "executable paths a name may resolve to"]
    assert len(load_rules(rules_path).rules) == 16
    rules = rules_of(rules_path)
    assert rules["codex-2-git-push-reset-exec"] == {
        "id": "codex-2-git-push-reset-exec", "effect": "ask",
        "reason": "Pushing or resetting rewrites shared history: ask first.",
        "when": {"source": "agent", "tool": "exec_command",
                 "arguments": {"cmd": {"runs": {"prefix": [["git", "push"], ["git", "reset"]]}}}}}
    assert rules["codex-2-git-push-reset-shell-command"]["when"]["arguments"].keys() == {"command"}
    assert rules["codex-2-git-push-reset-shell"]["when"]["arguments"].keys() == {"action.commands"}
    assert rules["codex-2-git-push-reset-local-shell"]["when"]["arguments"].keys() == {"action.command"}
    assert rules["codex-3-rm-rf-exec"]["effect"] == "deny"
    assert rules["codex-4-npm-test-ci-exec"]["effect"] == "allow"  # no decision: allow
    assert rules["codex-4-npm-test-ci-exec"]["reason"].startswith("Imported from import_codex.rules:26: prefix_rule(")
    printed = passes(scenarios, 40)  # each match and not_match example, through each of the four tools
    assert "codex-1-git-status-log-diff-exec #3: exec_command git push (not matched): ask (rule " \
           "codex-2-git-push-reset-exec" in printed  # a not_match of one rule that another decides


def test_codex_rules_read_the_commands_inside_a_command_line(tmp_path):
    _, _, scenarios = imported(tmp_path, "codex", CODEX)
    add_scenarios(scenarios, [
        call("exec_command", "ask", "codex-2-git-push-reset-exec", cmd="git add . && git push"),
        call("exec_command", "ask", "codex-2-git-push-reset-exec", cmd="bash -lc 'git push origin main'"),
        call("exec_command", "deny", "codex-3-rm-rf-exec", cmd="make clean; rm -rf dist"),
        call("shell", "deny", "codex-3-rm-rf-shell", kind="shell_call", action={"commands": ["ls", "rm -rf /"]}),
        call("local_shell", "deny", "codex-3-rm-rf-local-shell", kind="local_shell_call",
             action={"command": ["rm", "-rf", "build"]}),
        call("exec_command", "allow", "codex-1-git-status-log-diff-exec", cmd="git status && git log -1"),
        call("exec_command", "allow", cmd="git status && curl example.com"),  # not all git status: no allow rule
        call("exec_command", "allow", cmd="echo git push"),
    ])
    passes(scenarios)


def test_gemini_cli_policy_becomes_rules_and_says_what_priorities_and_modes_change(tmp_path):
    run, rules_path, scenarios = imported(tmp_path, "gemini-cli", GEMINI)
    assert run.returncode == 1, run.stderr
    said = "\n".join(warnings(run))
    for line, why in ((16, "[[rule]] #3: approximate: Gemini CLI matches the pattern on the arguments' JSON text"),
                      (27, "[[rule]] #5: not translated: it applies only in approval modes autoEdit"),
                      (33, "[[rule]] #6: approximate"),
                      (45, "[[rule]] #8: approximate: its priority 999 over rule #2 (deny, priority 500), #3 (ask, "
                           "priority 300) is lost"),
                      (50, "[[rule]] #9: not translated: applies to one subagent's calls"),
                      (57, "[[safety_checker]] #1: a safety checker runs code of Gemini CLI's: not translated")):
        assert f"WARN import_gemini.toml:{line} {why}" in said, said
    assert len(warnings(run)) == 6
    rules = rules_of(rules_path)
    assert list(rules) == ["gemini-1-allow-git-status", "gemini-2-deny-rm-rf", "gemini-3-ask-git-push-reset",
                           "gemini-4-ask-web-fetch", "gemini-6-deny-read-file", "gemini-7-deny-mcp-untrusted-server",
                           "gemini-8-allow-run-shell-command"]
    assert len(load_rules(rules_path).rules) == 7
    assert rules["gemini-1-allow-git-status"]["when"]["arguments"] == {
        "command": {"runs": {"prefix": [["git", "status"], ["git", "diff"], ["ls"]]}}}
    assert rules["gemini-2-deny-rm-rf"]["reason"] == "Recursive deletes are not undone: use trash instead."
    assert rules["gemini-6-deny-read-file"]["when"]["arguments"] == {"file_path": {"matches": r"^(?:.*\.env)$"}}
    assert rules["gemini-7-deny-mcp-untrusted-server"]["when"] == {"source": "agent",
                                                                   "tool": "mcp_untrusted-server_*"}
    _, _, scenarios = imported(tmp_path, "gemini-cli", GEMINI)
    add_scenarios(scenarios, [
        call("run_shell_command", "ask", "gemini-3-ask-git-push-reset", command="git push origin main"),
        call("run_shell_command", "ask", "gemini-3-ask-git-push-reset", command="ls && git reset --hard"),
        call("run_shell_command", "deny", "gemini-2-deny-rm-rf", command="git status && rm -rf /"),
        call("run_shell_command", "allow", "gemini-1-allow-git-status", command="git status --short"),
        call("read_file", "deny", "gemini-6-deny-read-file", file_path="/srv/app/.env"),
        call("read_file", "allow", file_path="/srv/app/.env.example"),
        call("write_file", "allow", file_path="/srv/app/x"),  # the autoEdit-only rule is not translated
    ])
    passes(scenarios)


@pytest.mark.parametrize(("kind", "source"), [("claude-code", CLAUDE), ("codex", CODEX), ("gemini-cli", GEMINI)])
def test_shadow_rules_decide_nothing_and_the_scenarios_name_the_rules_that_would(tmp_path, kind, source):
    run, rules_path, scenarios = imported(tmp_path, kind, source, "--shadow")
    assert run.returncode == 1
    assert {rule.mode for rule in load_rules(rules_path).rules} == {"shadow"}
    spec = yaml.safe_load(scenarios.read_text())
    assert {scenario["expect"] for scenario in spec["scenarios"]} == {"allow"}
    assert all(isinstance(scenario["shadow"], list) and "rule" not in scenario for scenario in spec["scenarios"])
    assert sum(bool(scenario["shadow"]) for scenario in spec["scenarios"]) >= len(spec["scenarios"]) * 2 // 3
    passes(scenarios, len(spec["scenarios"]))


def test_a_file_translated_exactly_exits_0_and_prints_the_rules(tmp_path):
    source = tmp_path / "default.rules"
    source.write_text('prefix_rule(pattern = ["ls"], match = [["ls", "-la"]])\n'
                      'prefix_rule(["git", "push"], "prompt")  # positional, as Starlark allows\n')
    run = run_cli("policy", "import", "codex", str(source))
    assert run.returncode == 0, run.stderr
    assert not warnings(run)
    assert "# WARN" not in run.stdout
    printed = tmp_path / "printed.yaml"
    printed.write_text(run.stdout)
    assert [rule.id for rule in load_rules(printed).rules][::4] == ["codex-1-ls-exec", "codex-2-git-push-exec"]
    assert load_rules(printed).rules[4].effect == "ask"


def test_a_settings_file_in_a_project_reads_its_paths_from_the_project(tmp_path):
    project = tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    (project / ".claude" / "settings.json").write_text(
        '{"permissions": {"deny": ["Edit(/docs/**)", "Read(.env)"], "allow": ["Bash(make:*)"]}}')
    run, rules_path, scenarios = imported(tmp_path, "claude-code", project / ".claude" / "settings.json")
    assert run.returncode == 0, run.stderr
    rules = rules_of(rules_path)
    assert rules["claude-deny-edit-docs"]["when"]["arguments"] == {"file_path": {"under": [f"{project}/docs"]}}
    assert rules["claude-deny-read-env"]["when"]["arguments"] == {
        "file_path": {"under": [str(project)], "matches": r"(?s)(?:^|/)\.env(?=/|$)"}}
    passes(scenarios, 5)
    elsewhere = tmp_path / "elsewhere"
    run = run_cli("policy", "import", "claude-code", str(project / ".claude" / "settings.json"),
                  "--project-dir", str(elsewhere))
    assert f"under: [{elsewhere}/docs]" in run.stdout


@pytest.mark.parametrize(("kind", "name", "text", "said"), [
    ("claude-code", "settings.json", '{"permissions": {"allow": ["Bash"],}}',
     "settings.json:1: not valid JSON"),
    ("claude-code", "settings.json", '{"permissions": {"allow": ["Bash", 3]}}',
     "settings.json:1: permissions.allow must be a list of strings"),
    ("claude-code", "settings.json", '{"env": {}}', "settings.json: no `permissions` object"),
    ("codex", "team.rules", 'prefix_rule(pattern = ["ls"])\nGIT = "git"\n',
     "team.rules:2: only calls like prefix_rule(...) are read (the file is not executed); this line holds an "
     "assignment"),
    ("codex", "team.rules", 'prefix_rule(pattern = [GIT])\n', "team.rules:1: only strings and lists of strings"),
    ("codex", "team.rules", 'load("//x.star", "y")\n', "team.rules:1: load(...) is not a Codex execpolicy function"),
    ("codex", "team.rules", 'prefix_rule(pattern = ["ls"], decision = "maybe")\n',
     "team.rules:1: prefix_rule(): decision must be allow, prompt or forbidden"),
    ("codex", "team.rules", 'prefix_rule(pattern = [])\n', "team.rules:1: prefix_rule(): pattern must be a non-empty"),
    ("codex", "team.rules", '\nprefix_rule(pattern = ["ls"]\n', "team.rules:2: not valid Starlark"),
    ("gemini-cli", "team.toml", '[[rule]]\ntoolName = "x"\ndecision =\n', "team.toml:3: not valid TOML"),
    ("gemini-cli", "team.toml", '[[rule]]\ntoolName = "x"\ndecision = "maybe"\npriority = 1\n',
     "team.toml:1: [[rule]] #1: decision must be allow, deny or ask_user"),
])
def test_an_invalid_input_is_one_line_naming_the_file_and_line(tmp_path, kind, name, text, said):
    source = tmp_path / name
    source.write_text(text)
    run = run_cli("policy", "import", kind, str(source), "-o", str(tmp_path / "rules.yaml"))
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"toolkeeper: {tmp_path}/{said}" + run.stderr.split(said, 1)[1].rstrip()]
    assert not (tmp_path / "rules.yaml").exists()


def test_what_cannot_be_read_or_asked_is_exit_2(tmp_path):
    missing = run_cli("policy", "import", "gemini-cli", str(tmp_path / "none.toml"))
    assert missing.returncode == 2
    assert missing.stderr == f"toolkeeper: {tmp_path}/none.toml: cannot read it: No such file or directory\n"
    alone = run_cli("policy", "import", "codex", str(CODEX), "--scenarios", str(tmp_path / "s.yaml"))
    assert (alone.returncode, alone.stderr) == (2, "toolkeeper: --scenarios needs -o: the scenarios name the rules "
                                                   "file they test\n")
    misplaced = run_cli("policy", "import", "codex", str(CODEX), "--project-dir", str(tmp_path))
    assert misplaced.returncode == 2


@pytest.mark.parametrize("sample, kind", [("import_claude_settings.json", "claude-code"),
                                          ("import_codex.rules", "codex"), ("import_gemini.toml", "gemini-cli")])
def test_the_format_is_told_from_the_file_when_not_given(tmp_path, sample, kind):
    source = ROOT / "tests" / "policies" / sample
    told = run_cli("policy", "import", str(source), "-o", str(tmp_path / "told.yaml"))
    said = run_cli("policy", "import", kind, str(source), "-o", str(tmp_path / "said.yaml"))
    assert told.returncode == said.returncode and told.returncode in (0, 1), told.stderr
    assert (tmp_path / "told.yaml").read_text() == (tmp_path / "said.yaml").read_text()
    unknown = tmp_path / "policy.txt"
    unknown.write_text("allow everything\n")
    refused = run_cli("policy", "import", str(unknown))
    assert refused.returncode == 2 and "cannot tell its format" in refused.stderr


# -- hostile inputs ---------------------------------------------------------------------------------------------

def _dozen_at_each_of_nine_places() -> str:
    """A Codex rules file of under a kilobyte whose pattern multiplies out into 12**9 (five billion) prefixes."""
    place = "[" + ", ".join(f'"o{i}"' for i in range(12)) + "]"
    return f'prefix_rule(pattern = [{", ".join([place] * 9)}], decision = "forbidden")\n'


HOSTILE = [
    ("codex", "expand.rules", _dozen_at_each_of_nine_places(),
     'expand.rules:1: prefix_rule(): its pattern\'s alternatives (12 x 12 x 12 x 12 x 12 x 12 x 12 x 12 x 12) make '
     "5,159,780,352 prefixes; toolkeeper writes at most 256 for one rule"),
    ("codex", "concatenated.rules", 'prefix_rule(pattern = ["a"' + '+"a"' * 200_000 + "])\n",
     "concatenated.rules: nested too deeply to be read"),
    ("codex", "unary.rules", "prefix_rule(pattern = [" + "-" * 200_000 + "1])\n", "unary.rules: nested too deeply"),
    ("claude-code", "settings.json", '{"permissions": {"deny": ' + "[" * 100_000 + "]" * 100_000 + "}}",
     "settings.json: nested too deeply to be read"),
    ("gemini-cli", "policy.toml", "[[rule]]\ntoolName = 'x'\nx = " + "[" * 100_000 + "]" * 100_000 + "\n",
     "policy.toml: nested too deeply to be read"),
    ("claude-code", "large.json", '{"permissions": {"allow": [' + ", ".join(['"Bash(ls)"'] * 120_000) + "]}}",
     "large.json: larger than 1024 KiB"),
    ("codex", "nul.rules", 'prefix_rule(pattern = ["ls"])\0\n', "nul.rules: not valid Starlark"),
]


@pytest.mark.parametrize(("kind", "name", "text", "said"), HOSTILE, ids=[name for _, name, _, _ in HOSTILE])
def test_a_hostile_input_is_refused_with_exit_2_and_one_line_in_bounded_time(tmp_path, kind, name, text, said):
    """Five billion prefixes from 750 bytes, a chain the parser cannot climb, a nesting, a file past any config's
    size: refused before they cost, exit 2 and one line naming the file, never a traceback."""
    import time

    source = tmp_path / name
    source.write_text(text)
    started = time.monotonic()
    run = run_cli("policy", "import", kind, str(source), "-o", str(tmp_path / "rules.yaml"), timeout=60)
    took = time.monotonic() - started
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.startswith(f"toolkeeper: {tmp_path}/{said}") and len(run.stderr.splitlines()) == 1, run.stderr
    assert took < 15 and not (tmp_path / "rules.yaml").exists()


def test_a_webfetch_domain_reads_the_host_as_claude_code_does(tmp_path):
    """`domain:HOST` is the host of `new URL(url)`: the port (even empty), the userinfo, the case and the trailing
    slashes or backslashes do not hide it from a deny; a subdomain or a host named only in a userinfo is another
    host; and an allow holds only for the host written plainly."""
    settings = tmp_path / "settings.json"
    settings.write_text('{"permissions": {"deny": ["WebFetch(domain:example.com)", "WebFetch(domain:10.0.0.7)"], '
                        '"allow": ["WebFetch(domain:docs.python.org)"]}}')
    run, _, scenarios = imported(tmp_path, "claude-code", settings)
    assert run.returncode == 0, run.stderr
    denied = ("http://example.com:/x", "http://a@example.com/", "https://a@b@example.com:443/", "HTTPS://EXAMPLE.COM/",
              "https://example.com./", "http://example.com\\@evil.test/", "https:example.com/x", "https:\\\\example.com",
              " https://example.com", "https://exam\tple.com/", "https://ex%61mple.com/",
              "https://\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com/", "http://167772167/", "http://10.7/")
    other_hosts = ("https://www.example.com/", "http://example.com@evil.test/", "https://example.com.evil.test/",
                   "https://evil.test/?next=https://example.com/", "https://notexample.com/")
    not_plainly = ("https://docs.python.org@evil.test/", "https://docs.python.org./",
                   "https://docs.python.org.evil.test/")
    add_scenarios(scenarios, [
        *(call("WebFetch", "deny", "claude-deny-webfetch-example-com" if "10." not in url and "167772167" not in url
               else "claude-deny-webfetch-10-0-0-7", url=url) for url in denied),
        *(call("WebFetch", "allow", url=url) for url in other_hosts),  # no rule: allowed, as Claude Code's own
        call("WebFetch", "allow", "claude-allow-webfetch-docs-python-org", url="https://u@DOCS.python.org:/3/"),
        *(call("WebFetch", "allow", url=url) for url in not_plainly),  # allowed by no rule, not by the import
        # a host no regular expression can read (the parser decodes it) counts as matching every deny
        call("WebFetch", "deny", "claude-deny-webfetch-example-com", url="https://docs%2epython.org/"),
    ])
    passes(scenarios)


# -- wildcards in time linear in the text (a second reader's findings on issue 39) -------------------------------

MANY_WILDCARDS = {"permissions": {
    "deny": ["Bash(" + "a*" * 60 + "b:*)", "Bash(cp */*/* /*)", "Bash(scp *@*:*)", "Read(**/a/**/a/**/a/**/b)",
             "Read(" + "*a" * 30 + "*b)", "Read(.env)", "Read(./secrets/*.pem)"],
    "allow": ["Bash(" + "*x" * 24 + ")", "Bash(* --version)", "Edit(src/**/test_*.py)"]}}
LONG = 64 * 1024
HOSTILE_TEXTS = ["cp " + "/" * LONG + "!;", "cp /a/b/c ;" * (LONG // 11), "x" * LONG + "y", "a" * LONG,
                 "a/" * (LONG // 2), "/.env" * (LONG // 5) + "\nx", "/" * LONG, ("a\n") * (LONG // 2) + "/x",
                 "; " * (LONG // 2), "\n " * (LONG // 2) + "x", "/secrets" * (LONG // 8)]


def test_wildcards_import_at_once_and_decide_in_time_linear_in_the_text(tmp_path):
    """Sixty wildcards in an entry, or `cp */*/* /*` on a 64 KiB command: each imported regular expression reads
    the text in one pass (an atomic group for each text between wildcards), where `.*` between them took
    exponential time to import and cubic time to decide (24 s froze the server on 2,500 characters)."""
    import json
    import time

    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps(MANY_WILDCARDS))
    started = time.monotonic()
    run, rules_path, scenarios = imported(tmp_path, "claude-code", settings)
    assert run.returncode == 1 and time.monotonic() - started < 15, run.stderr
    passes(scenarios)
    worst = 0.0
    for rule in load_rules(rules_path).rules:
        for test in rule.when.arguments.values():
            if test.matches is None:
                continue
            pattern = re.compile(test.matches)
            for text in HOSTILE_TEXTS:
                started = time.perf_counter()
                pattern.search(text)
                worst = max(worst, time.perf_counter() - started)
    assert worst < 0.05, f"{worst * 1000:.0f} ms"


def plain_command_regex(pattern: str, effect: str) -> str:
    """The expression an entry's wildcards mean, `.*` between the texts (what the import wrote before)."""
    from toolkeeper.policy.imports_base import BLANK, COMMAND_END, COMMAND_START, NO_OPERATOR

    def literal(text: str) -> str:
        return "".join(BLANK + "+" if part.isspace() else re.escape(part) for part in re.split(r"(\s+)", text) if part)

    body = (NO_OPERATOR if effect == "allow" else ".*").join(literal(part) for part in pattern.split("*"))
    return rf"^\s*{body}\s*$" if effect == "allow" else f"{COMMAND_START}{body}{COMMAND_END}"


def test_a_linear_wildcard_matches_exactly_what_the_plain_expression_matches():
    """Thousands of random entries and command lines: the atomic expression and the plain one agree on every
    line (line breaks, operators, blanks and leading spaces included); so do the path globs."""
    import random

    from toolkeeper.policy.imports_base import _glob_tokens, command_regex, glob_regex
    from toolkeeper.policy.imports_claude import WHOLE, _searched

    rng = random.Random(39)
    pieces, words = "a/ *;&|(\t$>", ["a", "/", " ", "\t", ";", "&", "|", "(", ")", "\n", "x", "a/", "`", "$", "  "]
    for _ in range(1500):
        pattern = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 7))).strip()
        for effect in ("allow", "deny") if pattern else ():
            ours, plain = re.compile(command_regex(pattern, effect)), re.compile(plain_command_regex(pattern, effect))
            for text in ("".join(rng.choice(words) for _ in range(rng.randint(0, 14))) for _ in range(20)):
                assert bool(ours.search(text)) == bool(plain.search(text)), (pattern, effect, text)
    globs, names = ["a", "b", "/", "*", "*", "**/", "**", "?", "[ab]", "[!a]", ".", "a/"], ["a", "b", "/", ".", "\n"]
    for _ in range(1500):
        glob = "".join(rng.choice(globs) for _ in range(rng.randint(1, 8)))
        plain = "".join(regex for _, regex, _ in _glob_tokens(glob))
        pairs = [(glob_regex(glob, WHOLE) + "(?:/.*)?", plain + "(?:/.*)?", True),
                 (_searched("**/" + glob), f"(?:^|/){plain}(?:/.*)?$", False),
                 (_searched(glob), f"^{plain}(?:/.*)?$", False)]
        for ours, theirs, whole in pairs:
            ours, theirs = re.compile(ours, re.S), re.compile(theirs, re.S)
            for text in ("".join(rng.choice(names) for _ in range(rng.randint(0, 10))) for _ in range(10)):
                agree = bool(ours.fullmatch(text)) == bool(theirs.fullmatch(text)) if whole else \
                    bool(ours.search(text)) == bool(theirs.search(text))
                assert agree, (glob, text)


def _gemini_rules(count: int, names: int, pattern: bool) -> str:
    """Rules of alternating decisions, the less restrictive of higher priority, each naming many tools."""
    tables = []
    for number in range(count):
        tools = ", ".join(f'"t{number % 2}_{index}{"*" if pattern else ""}"' for index in range(names))
        decision, priority = ("deny", 1) if number % 2 == 0 else ("allow", 9)
        tables.append(f"[[rule]]\ntoolName = [{tools}]\ndecision = \"{decision}\"\npriority = {priority}\n")
    return "\n".join(tables)


@pytest.mark.parametrize(("count", "names", "pattern", "stopped"), [(100, 180, False, False), (200, 150, True, True)],
                         ids=["plain-names", "patterns"])
def test_gemini_priority_overlap_is_bounded_and_says_when_it_stops(tmp_path, count, names, pattern, stopped):
    """100 rules of 180 tool names took 38 s to compare (tools x tools x rules x rules); now plain names are
    compared as sets, and past a bound of comparisons the rest is not compared, which a warning says."""
    import time

    source = tmp_path / "policy.toml"
    source.write_text(_gemini_rules(count, names, pattern))
    started = time.monotonic()
    run = run_cli("policy", "import", "gemini-cli", str(source), "-o", str(tmp_path / "rules.yaml"), timeout=60)
    assert time.monotonic() - started < 15 and "Traceback" not in run.stderr, run.stderr[-2000:]
    said = [line for line in warnings(run) if "priorit" in line]
    if stopped:
        assert run.returncode == 1 and said == [
            "WARN policy.toml: approximate: priorities not compared from [[rule]] #2 on (more than 1,000,000 "
            "comparisons of tool names and prefixes): where a higher priority let a less restrictive rule decide, "
            "here the most restrictive rule that matches decides"], said
    else:
        assert run.returncode == 0 and said == [], said  # t0_ and t1_ never meet: nothing lost, nothing said
