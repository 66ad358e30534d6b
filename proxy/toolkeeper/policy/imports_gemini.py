"""Gemini CLI's policy engine rules (TOML `[[rule]]` tables) as toolkeeper rules.

    [[rule]]
    toolName = "run_shell_command"
    commandPrefix = ["git push", "git reset"]
    decision = "ask_user"            # allow | deny | ask_user
    priority = 100

`commandPrefix` (a command, or it followed by arguments) becomes
`runs: {prefix: ...}`; `commandRegex` and `argsPattern` regular expressions on
one argument (approximate: Gemini CLI reads them on the arguments' JSON text);
`toolName` and `mcpName` the tool globs Gemini CLI's hook names
(`mcp_<server>_<tool>`). Gemini CLI lets the highest priority decide;
toolkeeper lets the most restrictive: where that changes a decision, it is said.
Rules for other approval modes than `default`, for a subagent, for tool
annotations or for headless runs only are not translated.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkeeper.policy.imports_base import (
    COMMAND_START,
    RANK,
    Call,
    Imported,
    ImportResult,
    PolicyImportError,
    Translation,
    agent_call,
    each_command,
    make_rule,
    prefixes_test,
    shell_words,
)

DECISIONS = {"allow": "allow", "deny": "deny", "ask_user": "ask"}
MODES = {"default", "autoEdit", "plan", "yolo"}
KEYS = {"toolName", "mcpName", "commandPrefix", "commandRegex", "argsPattern", "decision", "priority", "denyMessage",
        "deny_message", "modes", "interactive", "subagent", "toolAnnotations", "allowRedirection", "allow_redirection"}
SHELL = "run_shell_command"
ARGS_PATTERN = re.compile(r'"(\w+)":"(.*)', re.S)  # the one shape translated: a pattern on one argument's text
PATTERN = re.compile(r"[*?\[]")  # a tool name that is a pattern to fnmatch
MAX_OVERLAP_CHECKS = 1_000_000  # tool names and prefixes the priority check compares, at most (~1 s)


@dataclass
class _Made:
    item: Imported
    number: int
    where: str
    priority: int
    tools: list[str] | None
    prefixes: list[list[str]] | None  # None: no commandPrefix (a pattern, or no test of the command)


def import_gemini_cli(text: str, source: Path) -> ImportResult:
    """The `[[rule]]` tables of a Gemini CLI policy file as rules."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        said = str(exc)
        at = re.search(r" \(at line (\d+), column \d+\)$", said)
        where, said = (f"{source}:{at.group(1)}", said.removesuffix(at.group(0))) if at else (str(source), said)
        raise PolicyImportError(f"{where}: not valid TOML: {said}") from None
    out = Translation(source, "gemini")
    for key, value in data.items():
        if key != "rule":
            lines = _lines(text, key)
            for index in range(len(value) if isinstance(value, list) else 1):
                why = "a safety checker runs code of Gemini CLI's" if key == "safety_checker" else "unknown table"
                line = lines[index] if index < len(lines) else None
                out.warn(out.where(line, f"[[{key}]] #{index + 1}"), f"{why}: not translated")
    rules = data.get("rule", [])
    if not isinstance(rules, list) or not all(isinstance(rule, dict) for rule in rules):
        raise PolicyImportError(f"{source}: `rule` must be [[rule]] tables")
    lines = _lines(text, "rule")
    made = []
    for number, entry in enumerate(rules, 1):
        line = lines[number - 1] if number <= len(lines) else None
        result = _rule(out, number, entry, line)
        if result is not None:
            made.append(result)
    _priorities(out, made)
    return out.result()


def _lines(text: str, table: str) -> list[int]:
    """The line of each `[[table]]` header (or `[table]`), in order."""
    header = re.compile(rf"\s*\[\[?\s*{re.escape(table)}\s*\]")
    return [number for number, line in enumerate(text.splitlines(), 1) if header.match(line)]


def _rule(out: Translation, number: int, entry: dict[str, Any], line: int | None) -> _Made | None:
    where = out.where(line, f"[[rule]] #{number}")
    decision, priority = entry.get("decision"), entry.get("priority", 0)
    if decision not in DECISIONS:
        raise PolicyImportError(f"{out.source}:{line}: [[rule]] #{number}: decision must be allow, deny or ask_user "
                                f"(got {decision!r})")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PolicyImportError(f"{out.source}:{line}: [[rule]] #{number}: priority must be an integer")
    for key in sorted(set(entry) - KEYS):
        out.warn(where, f"unknown key {key}: not translated")
    if not _applies(out, entry, where):
        return None
    effect = DECISIONS[decision]
    tools = _tools(out, entry, where)
    if tools == []:
        return None
    arguments, prefixes, examples = _arguments(out, entry, where, effect)
    if arguments is None:
        return None
    shown = ", ".join(f"{key} = {json.dumps(value)}" for key, value in entry.items() if key in KEYS)
    reason = entry.get("denyMessage") or entry.get("deny_message") or \
        f"Imported from {out.source.name}:{line}: [[rule]] {shown}"
    name = " ".join((prefixes or [[]])[0]) or entry.get("commandRegex") or (tools or ["any tool"])[0]
    rule = make_rule(out.rule_id(str(number), effect, name), effect, reason, tools, arguments)
    item = Imported(rule, _matches(entry, tools, effect))
    if examples is None:
        tool = (tools or ["example_tool"])[0].replace("*", "example")
        item.examples = [(agent_call(tool, {"command": "echo example"} if tool == SHELL else {}), True)]
    else:
        item.examples = [(agent_call(SHELL, example), True) for example in examples]
    out.imported.append(item)
    return _Made(item, number, where, priority, tools, prefixes)


def _applies(out: Translation, entry: dict[str, Any], where: str) -> bool:
    """Whether the rule applies in Gemini CLI's default, interactive mode (what toolkeeper sees); what differs."""
    modes = entry.get("modes") or []
    for key, why in (("subagent", "applies to one subagent's calls, which toolkeeper cannot tell apart"),
                     ("toolAnnotations", "tests the tool's annotations, which toolkeeper does not see")):
        if key in entry:
            out.warn(where, f"not translated: {why}")
            return False
    if modes and "default" not in modes:
        out.warn(where, f"not translated: it applies only in approval modes {', '.join(modes)}, and toolkeeper "
                        "has none (it reads Gemini CLI's default mode)")
        return False
    if entry.get("interactive") is False:
        out.warn(where, "not translated: it applies only to headless runs, which toolkeeper cannot tell apart")
        return False
    if modes and set(modes) != MODES:
        out.warn(where, f"approximate: it applies in every approval mode here, not only in {', '.join(modes)}")
    if entry.get("interactive") is True:
        out.warn(where, "approximate: it applies to headless runs too")
    if "allowRedirection" in entry or "allow_redirection" in entry:
        out.warn(where, "allowRedirection not translated: toolkeeper does not ask about redirections by itself")
    return True


def _tools(out: Translation, entry: dict[str, Any], where: str) -> list[str] | None:
    """The tool globs, as Gemini CLI's hook names them; None for every tool; [] when the rule cannot be read."""
    names = entry.get("toolName")
    names = [names] if isinstance(names, str) else names or []
    server = entry.get("mcpName")
    if "commandPrefix" in entry or "commandRegex" in entry:
        if names not in ([], [SHELL]):
            out.warn(where, f"not translated: commandPrefix and commandRegex are for toolName = \"{SHELL}\" only")
            return []
        return [SHELL]
    if server is not None:
        return [f"mcp_{server}_{name}" if name != "*" else f"mcp_{server}_*" for name in names] or \
            (["mcp_*"] if server == "*" else [f"mcp_{server}_*"])
    if not names:
        out.warn(where, "approximate: no toolName: read as every tool")
    return None if not names or "*" in names else names


def _arguments(out: Translation, entry: dict[str, Any], where: str, effect: str):
    """(the argument tests, the command prefixes, the example arguments); None tests: not translated."""
    if "commandPrefix" in entry:
        given = entry["commandPrefix"]
        given = [given] if isinstance(given, str) else given
        prefixes = [shell_words(text) if isinstance(text, str) else None for text in given or []]
        if not prefixes or any(not words for words in prefixes):
            out.warn(where, "not translated: a commandPrefix that is not a command line")
            return None, None, None
        if any(" ".join(words) != " ".join(text.split()) for words, text in zip(prefixes, given, strict=True)):
            out.warn(where, "approximate: the prefix's quoting is read as shell words")
        return {"command": prefixes_test(prefixes)}, prefixes, [{"command": text} for text in given]
    if "commandRegex" in entry:
        return _pattern(out, where, effect, "command", entry["commandRegex"], start=True), None, []
    if "argsPattern" in entry:
        shape = ARGS_PATTERN.fullmatch(entry["argsPattern"])
        if shape is None:
            out.warn(where, "not translated: argsPattern reads all the arguments' JSON text; toolkeeper tests one "
                            'argument at a time (a pattern starting "NAME":" is translated)')
            return None, None, None
        return _pattern(out, where, effect, shape.group(1), shape.group(2), start=False), None, []
    return {}, None, None


def _pattern(out: Translation, where: str, effect: str, argument: str, pattern: str, *, start: bool):
    ends = pattern.endswith('"') and not pattern.endswith('\\"')
    regex = f"(?:{pattern[:-1] if ends else pattern}){'$' if ends else ''}"
    regex = f"{COMMAND_START}{regex}" if start and effect != "allow" else f"^{regex}"
    try:
        re.compile(regex)
    except re.error as exc:
        out.warn(where, f"not translated: the regular expression does not compile in Python ({exc})")
        return None
    out.warn(where, "approximate: Gemini CLI matches the pattern on the arguments' JSON text (quotes and "
                    f"backslashes escaped); here it is searched in the {argument} argument's text, from its start"
                    + (" or a command's" if start and effect != "allow" else ""))
    return {argument: {"matches": regex}}


def _matches(entry: dict[str, Any], tools: list[str] | None, effect: str):
    """Gemini CLI's reading: the tool name, then the pattern on the arguments as JSON text, for each command."""
    if "commandPrefix" in entry:
        given = entry["commandPrefix"]
        patterns = [f'"command":"{re.escape(json.dumps(text)[1:-1])}(?:[\\s"]|\\\\")'
                    for text in ([given] if isinstance(given, str) else given)]
    elif "commandRegex" in entry:
        patterns = [f'"command":"{entry["commandRegex"]}']
    else:
        patterns = [entry["argsPattern"]] if "argsPattern" in entry else []

    def text(arguments: dict[str, Any]) -> str:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    named = _Names(tools)
    globbed = re.compile("|".join(fnmatch.translate(tool) for tool in named.patterns)) if named.patterns else None

    def matches(call: Call) -> bool:  # the tool: one of the plain names, or a pattern's (one expression for all)
        if tools is not None and call["tool"] not in named.plain and not (globbed and globbed.match(call["tool"])):
            return False
        arguments = call.get("arguments") or {}
        if not patterns:
            return True
        if "argsPattern" in entry:
            return re.search(patterns[0], text(arguments)) is not None
        return each_command(arguments.get("command"), effect, lambda part: any(
            re.search(pattern, text({**arguments, "command": part})) for pattern in patterns))

    return matches


def _priorities(out: Translation, made: list[_Made]) -> None:
    """Say where Gemini CLI's priority order would have let a less restrictive rule decide. The comparisons are
    bounded (MAX_OVERLAP_CHECKS): past them, the rest is not compared, and that is said."""
    budget = [MAX_OVERLAP_CHECKS]
    names = {id(one): _Names(one.tools) for one in made}
    for first in made:
        lost = []
        for other in made:
            budget[0] -= 1
            if RANK[first.item.rule["effect"]] < RANK[other.item.rule["effect"]] \
                    and (first.priority, -first.number) > (other.priority, -other.number) \
                    and _overlap(first, other, names[id(first)], names[id(other)], budget):
                lost.append(f"#{other.number} ({other.item.rule['effect']}, priority {other.priority})")
            if budget[0] < 0:
                out.warn(out.source.name, f"approximate: priorities not compared from [[rule]] #{first.number} on "
                                          f"(more than {MAX_OVERLAP_CHECKS:,} comparisons of tool names and "
                                          "prefixes): where a higher priority let a less restrictive rule decide, "
                                          "here the most restrictive rule that matches decides")
                return
        if lost:
            out.warn(first.where, f"approximate: its priority {first.priority} over rule {', '.join(lost)} is lost: "
                                  "here the most restrictive rule that matches decides")


class _Names:
    """A rule's tool names: the plain ones as a set (compared at once), the patterns (`mcp_*`) one by one."""

    def __init__(self, tools: list[str] | None):
        self.plain = frozenset(tool for tool in tools or () if not PATTERN.search(tool))
        self.patterns = [tool for tool in tools or () if PATTERN.search(tool)]


def _overlap(one: _Made, other: _Made, ones: _Names, others: _Names, budget: list[int]) -> bool:
    """Whether some call may match both rules (a name either's pattern matches, a prefix of the other's); each
    name or prefix compared is taken from `budget`."""
    if one.tools is not None and other.tools is not None and not _names_meet(ones, others, budget):
        return False
    if one.prefixes is None or other.prefixes is None:
        return True
    budget[0] -= len(one.prefixes) * len(other.prefixes)
    return any(a[:len(b)] == b or b[:len(a)] == a for a in one.prefixes for b in other.prefixes)


def _names_meet(ones: _Names, others: _Names, budget: list[int]) -> bool:
    """A name both may take: a plain name in both; a plain one a pattern matches; two patterns either matches
    (as text: `mcp_a_*` and `mcp_*`)."""
    if not ones.plain.isdisjoint(others.plain):
        return True
    budget[0] -= len(ones.patterns) * (len(others.plain) + len(others.patterns)) + len(others.patterns) * len(
        ones.plain)
    if budget[0] < 0:
        return True  # not compared: said by the caller, counted as meeting meanwhile
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in ones.patterns for name in others.plain) or any(
        fnmatch.fnmatchcase(name, pattern) for pattern in others.patterns for name in ones.plain) or any(
        fnmatch.fnmatchcase(a, b) or fnmatch.fnmatchcase(b, a) for a in ones.patterns for b in others.patterns)
