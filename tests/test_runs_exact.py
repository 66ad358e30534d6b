"""`runs:` and the path tests exact about what they look at (issue 38, part 4).

A pattern in a command may name what a rule names (`.env*` and `.env`); a glob over homes is under `~/.aws`;
`-C DIR` moves where the paths after it are read from; `arguments:` reads each word (a `+ref` refspec); `not_under:
[.]` is outside the working directory; `a|b` tests whichever argument a call has. What can only be told by the
files there is unknown: it matches a deny or an ask, never an allow.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from toolkeeper.policy import load_rules, policy_input
from toolkeeper.policy.globs import braces, overlap
from toolkeeper.policy.paths import folder, name_matches, one_of, under

HOMES = (folder("~/.aws"), folder("~/.ssh"))


@pytest.mark.parametrize(("word", "glob", "meets"), [
    (".env*", ".env", True), (".en?", ".env", True), (".e[n]v", ".env", True), (".e[!n]v", ".env", False),
    ("*", "id_rsa", True), ("*env", ".env", True), ("*.py", "*.pem", False), ("a*b", "*.key", False),
    ("*.PEM", "*.pem", True), ("id_*", "id_*.pub", True), ("[[:alpha:]]env", "xenv", True),
    ("@(a|b)", "zz", True), ("x\\*", "x*", True), ("x\\*", "xy", False), (".env.ex*", ".env", False),
])
def test_two_patterns_overlap_when_some_name_matches_both(word, glob, meets):
    assert overlap(word, glob) is meets


def test_braces_are_the_words_they_stand_for():
    assert braces("*.{pem,key}") == ["*.pem", "*.key"]
    assert braces("a{b,c{d,e}}f") == ["abf", "acdf", "acef"]
    assert braces("{}") == ["{}"] and braces("x{a}") == ["x{a}"]
    assert braces("{a,b}" * 7) is None  # 128 words: too many to list, so unknown


@pytest.mark.parametrize(("path", "answer"), [
    ("/home/*/.aws/credentials", None), ("/Users/*/.ssh/id_rsa", None), ("/home/*/.ssh", None),
    ("/home/me/*/credentials", None), ("/home/me/.ssh/*", True), ("~/.ss?/x", None), (".ss?/x", None),
    ("/home/*", False), ("/home/me/proj/*", False), ("src/*.py", False), ("**/*.py", False), ("*/x", False),
    ("/etc/*", False),
])
def test_a_pattern_is_under_a_folder_when_some_path_it_matches_may_be(path, answer):
    assert under(path, HOMES, None) is answer


def test_dot_is_the_working_directory():
    here = (folder("."),)
    assert under("build", here, None) is True and under("*", here, None) is True
    assert under("../..", here, None) is None and under("/tmp/x", here, None) is None
    assert under("../..", here, "/home/me/proj") is False and under("/home/me/proj/x", here, "/home/me/proj")
    assert under("~/proj/x", here, "/home/me/proj") is None  # a home toolkeeper cannot place
    assert one_of(".", here, None) is True and one_of("src", here, None) is False


@pytest.mark.parametrize(("path", "answer"), [
    ("/home/*", None), ("/home/**", None), ("/home/me/*", True), ("/*", True), ("/tmp/*", False),
])
def test_a_pattern_may_be_every_home(path, answer):
    assert one_of(path, (folder("/"), folder("~")), None) is answer


def test_a_name_that_is_a_pattern_matches_unknown():
    assert name_matches(".env*", (".env",)) is None and name_matches("x/.ENV", (".env",)) is True
    assert name_matches(".env.example", (".env",)) is False and name_matches("*.o", (".env", "*.pem")) is False


def decide(rules_yaml: dict[str, Any], tmp_path, arguments: dict[str, Any], tool: str = "Bash",
           workdir: str | None = None) -> str:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"rules": [rules_yaml]}))
    decision = load_rules(path).decide(policy_input(tool, arguments, None, source="agent", workdir=workdir))
    return "none" if decision is None else decision.effect


def rule(effect: str, test: dict[str, Any], argument: str = "command", tool: Any = "Bash") -> dict[str, Any]:
    return {"id": "r", "effect": effect, "reason": "r",
            "when": {"source": "agent", "tool": tool, "arguments": {argument: test}}}


KEYS = {"runs": [{"under": ["~/.ssh", "~/.aws"]}, {"names": [".env", "id_rsa"]}]}


@pytest.mark.parametrize(("command", "workdir", "effect"), [
    ("cat .env*", None, "deny"), ("cat .en?", None, "deny"), ("cat .e[n]v", None, "deny"),
    ("cat /home/*/.aws/credentials", None, "deny"), ("cat README.md .env.example", None, "none"),
    ("tar -C ~ -czf x.tgz .ssh", "/home/me/p", "deny"), ("tar -czf x.tgz .ssh", "/home/me/p", "none"),
    ("tar --directory=$HOME -czf x.tgz .aws", "/home/me/p", "deny"), ("tar -xzC ~ -f x.tgz .ssh", "/home/me/p", "deny"),
    ("git -C ~/.ssh log", None, "deny"), ("make -C ~ -f x .aws/c", "/home/me/p", "deny"),
    ("env -C ~ cat .ssh/config", "/home/me/p", "deny"), ("tar czCf ~ x.tgz .ssh", "/home/me/p", "deny"),
])
def test_the_paths_a_command_names_from_where_it_reads_them(tmp_path, command, workdir, effect):
    assert decide(rule("deny", KEYS), tmp_path, {"command": command}, workdir=workdir) == effect


def test_a_pattern_is_never_allowed_by_what_it_may_match(tmp_path):
    allowed = rule("allow", {"runs": {"names": [".env"]}})
    assert decide(allowed, tmp_path, {"command": "cat .env"}) == "allow"
    assert decide(allowed, tmp_path, {"command": "cat .env*"}) == "none"


PUSHES = {"runs": [{"prefix": ["git", "push"], "flags": ["f"]},
                   {"prefix": ["git", "push"], "arguments": ["+?*", ":?*", "--force*", "--m*"]}]}


@pytest.mark.parametrize(("command", "effect"), [
    ("git push origin +refs/heads/main", "ask"), ("git push origin +HEAD:main", "ask"), ("git push --mirror", "ask"),
    ("git push -f", "ask"), ("git push --force-with-lease", "ask"), ("git push origin :main", "ask"),
    ("echo +main | xargs git push origin", "ask"), ("git push origin main", "none"), ("git push origin :", "none"),
    ("git stash push", "none"),
])
def test_arguments_reads_each_word_after_the_program(tmp_path, command, effect):
    assert decide(rule("ask", PUSHES), tmp_path, {"command": command}) == effect


OUTSIDE = {"runs": {"program": "rm", "flags": ["r"], "not_under": [".", "/tmp", "/dev/null"]}}


@pytest.mark.parametrize(("command", "workdir", "effect"), [
    ("rm -rf ../..", "/home/me/proj", "deny"), ("rm -rf ../..", None, "deny"), ("rm -rf ~/p", None, "deny"),
    ("cd / && rm -rf x", "/home/me/proj", "deny"), ("rm -rf /srv/x", "/home/me/proj", "deny"),
    ("rm -rf build", None, "none"), ("rm -rf ./dist node_modules", None, "none"), ("rm -rf /tmp/x", None, "none"),
    ("rm -rf build 2>/dev/null", "/home/me/proj", "none"), ("rm -rf /home/me/proj/x *", "/home/me/proj", "none"),
])
def test_not_under_dot_is_outside_the_working_directory(tmp_path, command, workdir, effect):
    assert decide(rule("deny", OUTSIDE), tmp_path, {"command": command}, workdir=workdir) == effect


def test_a_or_b_tests_whichever_argument_the_call_has(tmp_path):
    denied = rule("deny", {"under": ["/etc"]}, "file_path|notebook_path", ["Write", "NotebookEdit"])
    assert decide(denied, tmp_path, {"notebook_path": "/etc/x.ipynb"}, "NotebookEdit") == "deny"
    assert decide(denied, tmp_path, {"file_path": "/etc/hosts"}, "Write") == "deny"
    assert decide(denied, tmp_path, {"file_path": "notes.md"}, "Write") == "none"
    allowed = rule("allow", {"under": ["/srv"]}, "path|glob", "Grep")
    assert decide(allowed, tmp_path, {"path": "/srv/a", "glob": "/srv/*.py"}, "Grep") == "allow"
    assert decide(allowed, tmp_path, {"path": "/srv/a", "glob": "/etc/*"}, "Grep") == "none"  # each must hold
    absent = rule("deny", {"present": False}, "file_path|notebook_path", "Write")
    assert decide(absent, tmp_path, {"content": "x"}, "Write") == "deny"


def test_names_on_a_value_reads_patterns_and_braces(tmp_path):
    names = rule("deny", {"names": [".env", "*.pem"]}, "include|glob", ["Grep", "read_many_files"])
    assert decide(names, tmp_path, {"glob": ".env*"}, "Grep") == "deny"
    assert decide(names, tmp_path, {"include": ["src/*.ts", "certs/*.{pem,crt}"]}, "read_many_files") == "deny"
    assert decide(names, tmp_path, {"glob": "*.{ts,tsx}"}, "Grep") == "none"


def test_a_folder_is_absolute_from_home_or_the_working_directory(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"rules": [rule("deny", {"under": ["build"]})]}))
    with pytest.raises(Exception, match=r"or \. for the working directory"):
        load_rules(path)
