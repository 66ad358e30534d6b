"""What the three importers share: the rules they make, the warnings, the ids, and the scenarios.

Each importer turns one entry of the other agent's config into toolkeeper rules
(`Imported`), each with the source agent's own reading of a call (`matches`, its
semantics, not toolkeeper's) and example calls. The scenarios expect, for each
example, what the source entries that match it decide, combined as toolkeeper
combines (the most restrictive wins; no rule: allowed, as an agent's own tool
is); so `toolkeeper policy test` checks the translation against the original.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Call = dict[str, Any]  # {tool, arguments, source: agent, kind?}: a scenario's call
RANK = {"allow": 0, "ask": 1, "deny": 2}
# where a simple command starts and ends in a command line (after ;, &&, ||, |, a subshell's parenthesis, `)
COMMAND_START = r"(?:^|[;&|(`\n])\s*"
COMMAND_END = r"(?:\s*$|\s*[;&|)`\n])"
NO_OPERATOR = r"[^;&|`$()<>\n]*"  # a wildcard an allow may not stretch across another command
BLANK = r"[^\S\n]"  # a space in a command: any blank but a line break, which ends the command


# What one import may make: a config holds tens or hundreds of entries. Each example call is put to every
# entry's reading to write the scenarios, so the work grows as their product: both are bounded.
MAX_RULES = 2000
MAX_EXAMPLES = 4000


class PolicyImportError(Exception):
    """The input cannot be read or is not valid in its own format; the message names the file and line."""


@dataclass
class Imported:
    rule: dict[str, Any]
    matches: Callable[[Call], bool]  # the source agent's reading: does its entry apply to this call
    examples: list[tuple[Call, bool]] = field(default_factory=list)  # (call, whether the entry matches it)
    tools: frozenset[str] | None = None  # the only tools `matches` can hold for, when its reading says (else any)

    def may_match(self, call: Call) -> bool:
        return (self.tools is None or call["tool"] in self.tools) and self.matches(call)


@dataclass(frozen=True)
class ImportResult:
    rules: list[dict[str, Any]]
    scenarios: list[dict[str, Any]]  # each also lists in `shadow` every rule that matches it
    warnings: list[str]  # "<file>:<line> <entry>: <why>"


class Translation:
    """One import under way: the rules made so far, their ids, and what could not be said exactly."""

    def __init__(self, source: Path, prefix: str):
        self.source = source
        self.prefix = prefix
        self.imported: list[Imported] = []
        self.warnings: list[str] = []
        self._ids: set[str] = set()
        self._examples = 0

    def rule_id(self, *parts: str) -> str:
        """`claude-deny-bash-rm`: readable, stable for the same input, unique in the file."""
        words = [slug(part) for part in (self.prefix, *parts)]
        base = "-".join(word for word in words if word)
        candidate, number = base, 2
        while candidate in self._ids:
            candidate, number = f"{base}-{number}", number + 1
        self._ids.add(candidate)
        return candidate

    def warn(self, where: str, why: str) -> None:
        self.warnings.append(f"{where}: {why}")

    def where(self, line: int | None, entry: str) -> str:
        return f"{self.source.name}:{line} {entry}" if line else f"{self.source.name} {entry}"

    def add(self, rule: dict[str, Any], matches: Callable[[Call], bool],
            examples: list[tuple[Call, bool]] | None = None, *, tools: frozenset[str] | None = None) -> None:
        examples = examples or []
        self._examples += len(examples)
        if len(self.imported) >= MAX_RULES or self._examples > MAX_EXAMPLES:
            raise PolicyImportError(f"{self.source}: more than {MAX_RULES} rules or {MAX_EXAMPLES} examples to "
                                    "make, more than a permission config holds: split it, or import its parts")
        self.imported.append(Imported(rule, matches, examples, tools))

    def result(self) -> ImportResult:
        return ImportResult([item.rule for item in self.imported], scenarios(self.imported), self.warnings)


def slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")


def make_rule(rule_id: str, effect: str, reason: str, tool: str | list[str] | None,
              arguments: dict[str, Any] | None = None, *, source: str | None = "agent") -> dict[str, Any]:
    when: dict[str, Any] = {}
    if source:
        when["source"] = source
    if tool is not None:
        when["tool"] = tool[0] if isinstance(tool, list) and len(tool) == 1 else tool
    if arguments:
        when["arguments"] = arguments
    return {"id": rule_id, "effect": effect, "reason": reason, "when": when}


def agent_call(tool: str, arguments: dict[str, Any], kind: str | None = None) -> Call:
    call: Call = {"tool": tool, "source": "agent", "arguments": arguments}
    if kind:
        call["kind"] = kind
    return call


# The scenarios put every example to every entry's reading: the same command lines are split again and again.
@functools.lru_cache(maxsize=4096)
def _split(text: str) -> tuple[str, ...] | None:
    try:
        return tuple(shlex.split(text))
    except ValueError:
        return None


def shell_words(text: str) -> list[str] | None:
    words = _split(text)
    return None if words is None else list(words)


@functools.lru_cache(maxsize=4096)
def _simple_commands(command: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in re.split(r"&&|\|\||[;|\n]", command) if part.strip())


def simple_commands(command: str) -> list[str]:
    """A command line cut at ;, &&, ||, | and newlines: how the source agents read a compound command, for the
    examples (which are plain commands; a full shell parse is toolkeeper's own, in `runs:`)."""
    return list(_simple_commands(command))


def each_command(command: Any, effect: str, test: Callable[[str], bool]) -> bool:
    """The source agents' reading of a compound command: a deny or ask applies when one of its commands matches,
    an allow only when all do."""
    if not isinstance(command, str):
        return False
    parts = simple_commands(command)
    if not parts:
        return False
    return all(map(test, parts)) if effect == "allow" else any(map(test, parts))


def command_regex(pattern: str, effect: str) -> str:
    """A command with `*` wildcards as a regular expression on the command line: for an allow, the whole line
    is that one command; for a deny or ask, it is one of the line's commands. A space is any run of blanks (not
    a line break: it ends a command).

    It reads a line in time linear in its length, however many wildcards (a plain `.*` between the texts takes
    time exponential in their number where it fails, and `cp */*/* /*` cubic in the length). Each text between
    two wildcards is taken where it first appears (an atomic group, `(?>W*?TEXT)`), and it matches what the plain
    expression matches: a later place never leaves more for the rest, since no line break is in a text, a space
    next to a wildcard is one blank (the rest of the run is the wildcard's), and a text holding an operator an
    allow's wildcard stops at has no other place to be. A deny's search tries each line once, from the first
    place a command may start on it (tests/test_policy_import.py compares both on random lines)."""
    texts = re.split(r"\*+", pattern)
    wildcard = NO_OPERATOR if effect == "allow" else r"[^\n]*"
    body = [_literal(text, left=index > 0, right=index < len(texts) - 1) for index, text in enumerate(texts)]
    if len(body) == 1:  # an exact command
        return rf"^\s*+{body[0]}\s*$" if effect == "allow" else f"{COMMAND_START}{body[0]}{COMMAND_END}"
    first, *middle, last = body
    rest = "".join(f"(?>{wildcard}?{text})" for text in middle) + f"{wildcard}{'+' if not last else ''}{last}"
    if effect == "allow":  # the command on the line of the first character that is no space (when it has one)
        lead = r"^(?>\s*\n)?" if pattern.replace("*", "").strip() else r"^(?:\s*\n)?"
        return (rf"^\s*+{first}" if first else lead) + rest + r"\s*$"
    head = r"(?>(?:[^\n]*?[;&|(`])??" + BLANK + f"*{first})" if first else ""
    return f"(?m:^){head}{rest}{COMMAND_END}"


def _literal(text: str, *, left: bool = False, right: bool = False) -> str:
    """Text of a command pattern as a regular expression: a space any run of blanks; one next to a wildcard
    (`left`, `right`) a single blank, the rest of the run being the wildcard's."""
    parts = [part for part in re.split(r"(\s+)", text) if part]
    out = []
    for index, part in enumerate(parts):
        if not part.isspace():
            out.append(re.escape(part))
        else:
            edge = (index == 0 and left) or (index == len(parts) - 1 and right)
            out.append(BLANK if edge else BLANK + "+")
    return "".join(out)


def wildcard_fullmatch(pattern: str, text: str) -> bool:
    """`pattern`'s `*` any text (line breaks too), the rest itself, over the whole of `text`: in time linear in
    its length, each text between two wildcards taken where it first appears (a regular expression would
    backtrack, exponentially in the wildcards when it fails)."""
    if "*" not in pattern:
        return text == pattern
    first, *middle, last = pattern.split("*")
    if len(text) < len(first) + len(last) or not text.startswith(first) or not text.endswith(last):
        return False
    at, end = len(first), len(text) - len(last)
    for part in middle:
        found = text.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True


GAPS = {"*": "[^/]*", "**": ".*", "**/": "(?:.*/)?"}  # a glob's wildcards: in a name, anything, whole folders
LAZY = {"*": "[^/]*?", "**": ".*?", "**/": "(?:.*?/)??"}


def glob_regex(glob: str, end: str) -> str:
    """A path glob as a regular expression read with `(?s)` (a line break is a character like any other): `*`
    within a name, `**` anything, `**/` any folders, `?`, `[...]`; `end` (a lookahead) holds where it ends.

    It takes time linear in the path's length: the text after a wildcard is taken where it first appears (an
    atomic group) wherever a later place could never leave more to match: before the end, before `**`, before
    `**/` when it ends in `/`, and between two `*` in one name; after `**/`, the names up to the next `**/` are
    taken at the first folder where they all match."""
    return _sequence(_glob_pieces(glob), end, None)


def _sequence(pieces: list, end: str, after: str | None) -> str:
    """[text, wildcard, text, ..., text] as a regular expression; `after`: the wildcard that follows (None: the
    glob ends there, and `end` holds)."""
    out = ["".join(regex for regex, _ in pieces[0])]
    index = 1
    while index < len(pieces):
        gap = pieces[index]
        stop = index + 2
        if gap == "**/":  # the names after it, up to the next `**/` or `**`
            while stop < len(pieces) and pieces[stop] == "*":
                stop += 2
        following = pieces[stop] if stop < len(pieces) else after
        names = pieces[index + 1:stop]
        body = _sequence(names, end, following) if gap == "**/" else "".join(r for r, _ in names[0])
        body += end if following is None and gap != "**/" else ""
        last = names[-1]
        if following is None and gap == "*":  # the last name's end: one pass over the name
            out.append(GAPS[gap] + body)
        elif following is None or (last and _first_place_is_enough(gap, last, following)):
            out.append(f"(?>{LAZY[gap]}{body})")
        else:
            out.append(GAPS[gap] + body)
        index = stop
    return "".join(out) + (end if len(pieces) == 1 and after is None else "")


def _first_place_is_enough(gap: str, text: list[tuple[str, bool]], following: str) -> bool:
    """Whether a later place of `text` (a fixed run of characters after `gap`, or the names after a `**/`) leaves
    nothing the first does not to the `following` wildcard: it takes in anything (`**`), or whole folders after a
    text ending in `/`, or a name's characters after a text of them inside a name."""
    if following == "**":
        return True
    if following == "**/":
        return text[-1][0] == "/"
    return gap == following == "*" and all(in_name for _, in_name in text)


def _glob_pieces(glob: str) -> list:
    """[text, wildcard, text, ..., text]: each text a list of (regular expression, whether it is one character
    of a name, no `/`), each wildcard `*`, `**` or `**/`; wildcards side by side joined into one (`***`), but for
    `**/*` (any folders, then a name)."""
    pieces: list = [[]]
    for kind, regex, in_name in _glob_tokens(glob):
        if kind not in GAPS:
            pieces[-1].append((regex, in_name))
        elif len(pieces) > 1 and not pieces[-1] and (pieces[-2], kind) != ("**/", "*"):
            pieces[-2] = pieces[-2] if pieces[-2] == kind else "**"  # `***`, `**/**/`: what both match
        else:
            pieces += [kind, []]
    return pieces


def _glob_tokens(glob: str) -> list[tuple[str, str, bool]]:
    """(kind, regular expression, whether it is one character that is no `/`) for each part of a glob."""
    tokens, index = [], 0
    while index < len(glob):
        if glob.startswith("**/", index):
            tokens.append(("**/", "(?:.*/)?", False))
            index += 3
        elif glob.startswith("**", index):
            tokens.append(("**", ".*", False))
            index += 2
        elif glob[index] in "*?":
            tokens.append((glob[index], "[^/]*" if glob[index] == "*" else "[^/]", glob[index] == "?"))
            index += 1
        elif glob[index] == "[" and (end := glob.find("]", index + 2)) > 0:
            inside = glob[index + 1:end]
            regex = "[" + ("^" + inside[1:] if inside.startswith("!") else inside).replace("\\", "\\\\") + "]"
            tokens.append(("[]", regex, _no_slash(regex)))
            index = end + 1
        else:
            tokens.append(("", "/" if glob[index] == "/" else re.escape(glob[index]), glob[index] != "/"))
            index += 1
    return tokens


def _no_slash(regex: str) -> bool:
    try:
        return re.fullmatch(regex, "/") is None
    except re.error:
        return False


def prefixes_test(prefixes: list[list[str]]) -> dict[str, Any]:
    """`runs: {prefix: ...}`: one prefix as a list of words, several as a list of them."""
    return {"runs": {"prefix": prefixes[0] if len(prefixes) == 1 else prefixes}}


def scenarios(imported: list[Imported]) -> list[dict[str, Any]]:
    """One scenario per example: the decision the source's matching entries make, combined as toolkeeper combines,
    and the rule that decides (the first in the file of the most restrictive)."""
    found = []
    for item in imported:
        for number, (call, matched) in enumerate(item.examples, start=1):
            deciding = [other for other in imported if other.may_match(call)]
            if matched != (item in deciding):
                continue  # the example does not show this entry as its source reads it: not a test of it
            effect = max((other.rule["effect"] for other in deciding), key=RANK.__getitem__, default="allow")
            scenario: dict[str, Any] = {"name": f"{item.rule['id']} #{number}: {describe(call)}"
                                        + ("" if matched else " (not matched)"), "call": call, "expect": effect}
            first = next((other for other in deciding if other.rule["effect"] == effect), None)
            if first is not None:
                scenario["rule"] = first.rule["id"]
            scenario["shadow"] = [other.rule["id"] for other in deciding]  # every rule that matches (--shadow)
            found.append(scenario)
    return found


def describe(call: Call) -> str:
    """`Bash git push`, `local_shell git status`: the tool and its arguments' values, flattened."""

    def words(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [word for item in value.values() for word in words(item)]
        return [word for item in value for word in words(item)] if isinstance(value, list) else [str(value)]

    return " ".join([call["tool"], *words(call.get("arguments") or {})])[:100]
