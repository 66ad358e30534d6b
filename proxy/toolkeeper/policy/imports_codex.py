"""Codex CLI's execpolicy rules (Starlark `.rules`, `.codexpolicy`) as toolkeeper rules.

    prefix_rule(pattern = ["git", ["push", "fetch"]], decision = "prompt",
                justification = "...", match = ["git push origin"], not_match = [["git", "status"]])

The file is parsed, never executed: Python's `ast` reads this subset of
Starlark (calls with literal strings and lists, comments); anything else is an
error naming its line. A pattern's alternatives are expanded into prefixes
(`[[git, push], [git, fetch]]`), at most MAX_PREFIXES of them for a rule and
MAX_FILE_PREFIXES for the file: a pattern whose alternatives multiply past
that (a dozen at each of nine places is five billion) is refused, said.
`allow`, `prompt`, `forbidden` are allow, ask, deny. Codex's shell reaches
toolkeeper as four tools, each holding the command in its own argument, so
each prefix_rule becomes one rule per tool:
`exec_command` (`cmd`), `shell_command` (`command`), `shell` (the Responses
built-in: `action.commands`) and `local_shell` (`action.command`, an argv).
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import shlex
from pathlib import Path
from typing import Any

from toolkeeper.policy.imports_base import (
    Call,
    ImportResult,
    PolicyImportError,
    Translation,
    agent_call,
    each_command,
    make_rule,
    prefixes_test,
    shell_words,
)

DECISIONS = {"allow": "allow", "prompt": "ask", "forbidden": "deny"}
MAX_PREFIXES = 256  # the prefixes one prefix_rule's alternatives make, multiplied out
MAX_FILE_PREFIXES = 4096  # and those of all the file's rules: each is written four times, once per shell tool
PARAMETERS = {"prefix_rule": ("pattern", "decision", "match", "not_match", "justification"),
              "host_executable": ("name", "paths"),
              "network_rule": ("host", "protocol", "decision", "justification")}
NOT_TRANSLATED = {
    "host_executable": "not translated: toolkeeper's rules read the program as the command names it, and do not "
                       "check which executable paths a name may resolve to",
    "network_rule": "not translated: toolkeeper's rules decide tool calls, not the network connections a command "
                    "makes",
}
# (tool, id suffix, the call's kind, the argument holding the command)
SHAPES = (("exec_command", "exec", None, "cmd"), ("shell_command", "shell-command", None, "command"),
          ("shell", "shell", "shell_call", "action.commands"), ("local_shell", "local-shell", "local_shell_call",
                                                                 "action.command"))


def import_codex(text: str, source: Path) -> ImportResult:
    """The prefix rules of a Codex execpolicy file as rules, one per Codex shell tool."""
    try:
        tree = ast.parse(text, filename=str(source))
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte
        line = f":{exc.lineno}" if getattr(exc, "lineno", None) else ""
        raise PolicyImportError(f"{source}{line}: not valid Starlark: {getattr(exc, 'msg', None) or exc}") from None
    out = Translation(source, "codex")
    number, prefixes = 0, 0
    for statement in tree.body:
        name, values = _call(statement, source)
        if name == "prefix_rule":
            number += 1
            prefixes += _prefix_rule(out, number, values, statement.lineno, MAX_FILE_PREFIXES - prefixes)
        else:
            shown = ", ".join(f"{key} = {json.dumps(value)}" for key, value in values.items())
            out.warn(out.where(statement.lineno, f"{name}({shown})"), NOT_TRANSLATED[name])
    return out.result()


def _call(statement: ast.stmt, source: Path) -> tuple[str, dict[str, Any]]:
    """A top-level `name(key = literal, ...)`, or an error naming the line."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise PolicyImportError(f"{source}:{statement.lineno}: only calls like prefix_rule(...) are read (the file is "
                                f"not executed); this line holds {_what(statement)}")
    name = call.func.id
    if name not in PARAMETERS:
        raise PolicyImportError(f"{source}:{statement.lineno}: {name}(...) is not a Codex execpolicy function "
                                f"(known: {', '.join(PARAMETERS)})")
    names = PARAMETERS[name]
    if len(call.args) > len(names):
        raise PolicyImportError(f"{source}:{statement.lineno}: {name}() takes at most {len(names)} arguments")
    values = {key: _literal(node, source) for key, node in zip(names, call.args, strict=False)}
    for keyword in call.keywords:
        if keyword.arg not in names or keyword.arg in values:
            said = f"{keyword.arg} is given twice" if keyword.arg in values else \
                f"unknown argument {keyword.arg or '**'} (known: {', '.join(names)})"
            raise PolicyImportError(f"{source}:{keyword.value.lineno}: {name}(): {said}")
        values[keyword.arg] = _literal(keyword.value, source)
    return name, values


def _what(statement: ast.stmt) -> str:
    kinds = {ast.Assign: "an assignment", ast.FunctionDef: "a def", ast.For: "a loop", ast.If: "an if",
             ast.Import: "an import", ast.ImportFrom: "an import", ast.Expr: "an expression that is not a call"}
    return kinds.get(type(statement), f"a {type(statement).__name__} statement")


def _literal(node: ast.expr, source: Path) -> Any:
    if isinstance(node, ast.Constant) and (isinstance(node.value, str) or node.value is None):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item, source) for item in node.elts]
    raise PolicyImportError(f"{source}:{node.lineno}: only strings and lists of strings are read here (the file is "
                            f"not executed); this is {ast.unparse(node)[:60]}")


def _prefix_rule(out: Translation, number: int, values: dict[str, Any], line: int, room: int) -> int:
    """The rules of one prefix_rule, one per shell tool; the number of prefixes they hold (at most `room`)."""
    where = f"{out.source}:{line}: prefix_rule()"
    alternatives = _pattern(values.get("pattern"), where)
    _bound_expansion(alternatives, where, room)
    decision = values.get("decision") or "allow"
    if decision not in DECISIONS:
        raise PolicyImportError(f"{where}: decision must be allow, prompt or forbidden (got {decision!r})")
    justification = values.get("justification")
    if justification is not None and (not isinstance(justification, str) or not justification.strip()):
        raise PolicyImportError(f"{where}: justification must be a non-empty string")
    effect = DECISIONS[decision]
    prefixes = [list(words) for words in itertools.product(*alternatives)]
    examples = [(words, True) for words in _examples(values.get("match"), where)]
    examples += [(words, False) for words in _examples(values.get("not_match"), where)]
    if not any(matched for _, matched in examples):
        examples.insert(0, (prefixes[0], True))
    shown = json.dumps(values["pattern"])
    reason = justification or f"Imported from {out.source.name}:{line}: prefix_rule(pattern = {shown}, decision = " \
                              f"\"{decision}\")"
    name = " ".join(word for words in alternatives for word in words)
    for tool, suffix, kind, argument in SHAPES:
        rule = make_rule(out.rule_id(str(number), name, suffix), effect, reason, tool,
                         {argument: prefixes_test(prefixes)})
        out.add(rule, _matches(tool, argument, alternatives, effect),
                [(_example(tool, kind, argument, words), matched) for words, matched in examples],
                tools=frozenset({tool}))
    return len(prefixes)


def _bound_expansion(alternatives: list[list[str]], where: str, room: int) -> None:
    """Refuse a pattern whose alternatives multiply past the bounds, counted before anything is expanded."""
    count = math.prod(len(options) for options in alternatives)
    if count <= min(MAX_PREFIXES, room):
        return
    sizes = " x ".join(str(len(options)) for options in alternatives if len(options) > 1)
    limit = (f"at most {MAX_PREFIXES} for one rule" if count > MAX_PREFIXES else
             f"at most {MAX_FILE_PREFIXES} for the whole file, and the rules before it hold "
             f"{MAX_FILE_PREFIXES - room}")
    raise PolicyImportError(f"{where}: its pattern's alternatives ({sizes}) make {count:,} prefixes; toolkeeper "
                            f"writes {limit}: list fewer alternatives, or split the rule")


def _pattern(pattern: Any, where: str) -> list[list[str]]:
    if not isinstance(pattern, list) or not pattern:
        raise PolicyImportError(f"{where}: pattern must be a non-empty list")
    alternatives = []
    for token in pattern:
        options = [token] if isinstance(token, str) else token
        if not isinstance(options, list) or not options or not all(isinstance(word, str) for word in options):
            raise PolicyImportError(f"{where}: a pattern element is a string or a non-empty list of strings")
        alternatives.append(options)
    return alternatives


def _examples(examples: Any, where: str) -> list[list[str]]:
    if examples is None:
        return []
    if not isinstance(examples, list):
        raise PolicyImportError(f"{where}: match and not_match are lists of examples")
    found = []
    for example in examples:
        words = shell_words(example) if isinstance(example, str) else example
        if not isinstance(words, list) or not words or not all(isinstance(word, str) for word in words):
            raise PolicyImportError(f"{where}: an example is a command line or a non-empty list of strings "
                                    f"(got {example!r})")
        found.append(words)
    return found


def _example(tool: str, kind: str | None, argument: str, words: list[str]) -> Call:
    line = shlex.join(words)
    arguments = {"exec_command": {"cmd": line}, "shell_command": {"command": line},
                 "shell": {"action": {"commands": [line]}}, "local_shell": {"action": {"command": words}}}[tool]
    return agent_call(tool, arguments, kind)


def _matches(tool: str, argument: str, alternatives: list[list[str]], effect: str):
    """Codex's reading: the command's words start with the pattern's, an alternative at each place."""

    def starts(words: list[str] | None) -> bool:
        return words is not None and len(words) >= len(alternatives) and all(
            word in options for word, options in zip(words, alternatives, strict=False))

    def matches(call: Call) -> bool:
        if call["tool"] != tool:
            return False
        value: Any = call.get("arguments") or {}
        for part in argument.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if tool == "local_shell":
            return isinstance(value, list) and starts(value)
        lines = value if isinstance(value, list) else [value]
        if not lines or not all(isinstance(line, str) for line in lines):
            return False
        found = (each_command(line, effect, lambda part: starts(shell_words(part))) for line in lines)
        return all(found) if effect == "allow" else any(found)

    return matches
