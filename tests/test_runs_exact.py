"""`runs:` and the path tests exact about what they look at (issue 38, part 4).

A pattern in a command may name what a rule names (`.env*` and `.env`); a glob over homes is under `~/.aws`;
`-C DIR` moves where the paths after it are read from; `arguments:` reads each word (a `+ref` refspec); `not_under:
[.]` is outside the working directory; `a|b` tests whichever argument a call has. What can only be told by the
files there is unknown: it matches a deny or an ask, never an allow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from toolkeeper.policy import load_rules, policy_input
from toolkeeper.policy.globs import braces, overlap
from toolkeeper.policy.paths import folder, name_matches, one_of, reaches, under

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
    ("/etc/*", False), ("**/.aws/x", None), ("src/**/.ssh/x", None), ("**/credentials", False),
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


@pytest.mark.parametrize("path", [
    "/proc/self/root/root/.aws/credentials", "/proc/self/cwd/../.aws/credentials", "/proc/1/cwd", "/proc/self/root",
    "/proc/self/fd/3", "/proc/self/fd/3/x", "/dev/fd/5", "/dev/fd/0/../x", "/dev/stdin/..", "/proc/1/task/1/root/x",
    "/proc/*/root/x", "/pro?/1/cwd/x", "/tmp/../proc/self/root/etc", "//proc/./self/root/x",
])
def test_a_path_through_a_link_to_a_folder_anywhere_may_be_anywhere(path):
    assert under(path, HOMES, None) is None and under(path, (folder("/etc"),), "/home/me") is None
    assert one_of(path, (folder("/"), folder("~")), None) is None


@pytest.mark.parametrize("path", ["/proc/cpuinfo", "/proc/self/status", "/dev/fd/2", "/proc/self/fd/1", "/dev/stdin",
                                  "/dev/null", "/procx/self/root/x"])
def test_other_files_of_proc_and_dev_are_files(path):
    assert under(path, HOMES, None) is False and name_matches(path, (".env",)) is False


def test_the_name_of_a_link_or_of_the_folder_above_one_is_not_written():
    assert name_matches("/proc/self/fd/7", (".env",)) is None
    assert name_matches("/proc/self/cwd/..", (".env",)) is None
    assert name_matches("/proc/self/cwd/.env", (".env",)) is True
    assert name_matches("/proc/self/cwd/README.md", (".env",)) is False


@pytest.mark.parametrize(("path", "workdir", "answer"), [
    ("~", None, None), ("/", None, None), ("/home", None, None), ("/root", None, None), ("~/.aws/x", None, True),
    (".", "/home/me", None), (".", "/home/me/proj", False), ("/home/me/proj", None, False), ("src", None, False),
    (".", None, False), ("README.md", None, False), ("src/**/*.ts", None, False), ("/tmp", None, False),
])
def test_a_folder_reaches_the_folders_below_it(path, workdir, answer):
    assert reaches(path, HOMES, workdir) is answer


@pytest.mark.parametrize(("arguments", "workdir", "effect"), [
    ({"pattern": "**/.aws/*", "path": "/root"}, None, "deny"), ({"pattern": ".a*/credentials", "path": "~"}, None, "deny"),
    ({"pattern": "**/*", "path": "/home/me"}, None, "deny"), ({"pattern": "*/.ssh/*", "path": "/home"}, None, "deny"),
    ({"pattern": "**/*"}, "/home/me", "deny"), ({"pattern": "x", "path": "/home/me/.ssh"}, None, "deny"),
    ({"pattern": "*.md", "path": "~"}, None, "none"), ({"pattern": "**/*.py", "path": "src"}, None, "none"),
    ({"pattern": "**/*"}, "/home/me/proj", "none"), ({"pattern": "/srv/**/*.py", "path": "~"}, None, "none"),
    ({"path": "~"}, None, "none"),
])
def test_a_pattern_is_read_from_the_folder_the_call_names(tmp_path, arguments, workdir, effect):
    joined = rule("deny", {"under": ["~/.aws", "~/.ssh"]}, "pattern from path|dir_path", "Glob")
    assert decide(joined, tmp_path, arguments, "Glob", workdir) == effect


def test_a_pattern_read_from_a_folder_is_each_pattern_after_each_folder():
    from toolkeeper.policy.conditions import Alternatives, dotted
    assert dotted({"include": ["a/*", "/x"], "dir": "/r"}, "include from dir") == (True, ["/r/a/*", "/x"])
    assert dotted({"glob": "*.py"}, "glob from path") == (True, "*.py")
    assert dotted({"path": "/r"}, "glob from path") == (False, None)
    present, value = dotted({"p": "x", "a": "/1", "b": "/2/"}, "p from a|b")
    assert present and isinstance(value, Alternatives) and list(value) == ["/1/x", "/2/x"]


@pytest.mark.parametrize(("command", "effect"), [
    ("rm -* /x", "deny"), ("rm -[r]f /x", "deny"), ("rm --rec* /x", "deny"), ("rm -rf -* /x", "deny"),
    ("rm -f /x", "none"), ("rm -- -* /x", "none"), ("rm --include=* /x", "none"),
])
def test_flags_from_a_pattern_the_shell_expands_are_not_known(tmp_path, command, effect):
    assert decide(rule("deny", {"runs": {"program": "rm", "flags": ["r"]}}), tmp_path, {"command": command}) == effect


def test_an_argument_that_matches_only_with_case_folded_asks_and_never_allows(tmp_path):
    keys = {"runs": {"program": "tool", "arguments": ["*.push=+*"]}}
    assert decide(rule("ask", keys), tmp_path, {"command": "tool -c REMOTE.ORIGIN.PUSH=+HEAD:main"}) == "ask"
    assert decide(rule("allow", keys), tmp_path, {"command": "tool -c REMOTE.ORIGIN.PUSH=+HEAD:main"}) == "none"
    assert decide(rule("allow", keys), tmp_path, {"command": "tool -c remote.origin.push=+HEAD:main"}) == "allow"
    assert decide(rule("ask", keys), tmp_path, {"command": "tool -c remote.origin.push=HEAD:main"}) == "none"


SYSTEM = {"runs": {"writes_under": ["/etc", "/usr"]}}


@pytest.mark.parametrize(("command", "workdir", "effect"), [
    ("tar -C /etc -xf x.tar", None, "deny"), ("tar xf x.tar -C /etc", None, "deny"), ("cd /etc && tar -x", None, "deny"),
    ("tar -xf x.tar", "/etc", "deny"), ("tar -czf /etc/x.tgz .", None, "deny"), ("sort -o /etc/hosts x", None, "deny"),
    ("sort -o/etc/hosts x", None, "deny"), ("sort --output=/etc/hosts x", None, "deny"),
    ("curl -sSLo /etc/x https://x", None, "deny"), ("curl --output-dir /usr/bin -O https://x", None, "deny"),
    ("wget -P /usr/bin https://x", None, "deny"), ("link x /etc/x", None, "deny"), ("cp -t /etc x", None, "deny"),
    ("cp a b /etc/", None, "deny"), ("install -m 644 x /etc/x", None, "deny"), ("dd if=x of=/etc/x", None, "deny"),
    ("tee -a /etc/x", None, "deny"), ("ln -sf x /etc/x", None, "deny"), ("unzip x.zip -d /etc", None, "deny"),
    ("sed -i s/a/b/ /etc/hosts", None, "deny"), ("gcc -o /usr/bin/x x.c", None, "deny"), ("sudo -e /etc/x", None, "deny"),
    ("echo /etc/x | xargs tee", None, "deny"), ("rsync -a x /usr/ --exclude y", None, "deny"),
    ("curl -K cfg https://x", None, "deny"), ("wget -e output_document=/etc/x https://x", None, "deny"),
    ("tar -xPf x.tar", None, "deny"), ("gzip /etc/hosts", None, "deny"), ("split -b 1k x /etc/x", None, "deny"),
    ("wget -e robots=off https://x", None, "none"), ("gzip -c /etc/hosts", None, "none"),
    ("tar -C /etc -czf /tmp/x.tgz .", None, "none"), ("tar -tf /usr/x.tar", None, "none"),
    ("tar -xf /usr/x.tar", "/home/me/p", "none"), ("sort /etc/hosts -o /tmp/x", None, "none"),
    ("curl --cacert /etc/ssl/ca.crt -o out https://x", None, "none"), ("cp /etc/hosts x", None, "none"),
    ("sed s/a/b/ /etc/hosts", None, "none"), ("gcc -I/usr/include -o build/x x.c", None, "none"),
    ("rsync -a /usr/share/x build/", None, "none"), ("cat /etc/hosts; ls /usr/bin", None, "none"),
])
def test_writes_under_reads_what_the_programs_it_knows_write(tmp_path, command, workdir, effect):
    assert decide(rule("deny", SYSTEM), tmp_path, {"command": command}, workdir=workdir) == effect


def _patterns(node, found):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "matches" and isinstance(value, str):
                found.append(value)
            else:
                _patterns(value, found)
    elif isinstance(node, list):
        for value in node:
            _patterns(value, found)
    return found


HOSTILE = ["*** Update File: " + " " * 65536, "*** Update File: " + "a/" * 32768, "curl x " + "sh " * 21845,
           "curl x " + "| sudo a" * 8192, "curl " + "| " * 32768, "curl x; sh " + "a" * 65536, "/." * 32768,
           ".env" * 16384]


@pytest.mark.parametrize("policy", ["coding-agents.yaml", "default.yaml"])
def test_no_shipped_pattern_backtracks_on_hostile_text(policy):
    """A model writes the text a `matches:` test reads, and a regex holds the server while it runs: every shipped
    pattern stays linear (64 KiB of the worst shapes found, each well under a second where a backtracking one
    took 4 to 15 s)."""
    import re
    import time

    rules = yaml.safe_load((Path(__file__).resolve().parent.parent / "policies" / policy).read_text())
    for pattern in _patterns(rules, []):
        compiled = re.compile(pattern)
        for text in HOSTILE:
            started = time.perf_counter()
            compiled.search(text)
            assert time.perf_counter() - started < 1.0, (pattern[:60], text[:30])
