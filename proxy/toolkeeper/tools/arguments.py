"""Validate and coerce a model's arguments for a declared tool.

Invalid calls are answered, not rejected: the answer says what was wrong,
quotes what the model sent and lists what each parameter should be, so the
model can try again. Coercion is lenient only where no guess is needed:
"3" -> 3, "2.5" -> 2.5, "true"/"false" -> booleans.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from toolkeeper.common import dumps, nesting, printable, unencodable
from toolkeeper.tools.agentfile import DeclaredTool, Parameter, ToolSpec
from toolkeeper.tools.schemas import CLOSING_SENTENCE, constraint_words
from toolkeeper.tools.templates import RenderError, render_scalar

INTEGER_TEXT = re.compile(r"^\s*[-+]?\d+\s*$")
NUMBER_TEXT = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")
QUOTE_LIMIT = 2000
MAX_DEPTH = 32  # nesting of the arguments object; deeper is no call a tool needs
EXACT_FLOAT = 2**53  # past this, a float no longer holds every integer exactly


@dataclass
class Checked:
    """The outcome of checking one call: coerced values, or the reasons it is invalid."""

    values: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def parse_arguments(raw: Any, *, truncated: bool = False) -> tuple[dict[str, Any] | None, str | None]:
    """The arguments object from what the model sent (a JSON string, or an object from llama.cpp)."""
    if truncated:
        return None, ("the response was cut off (finish_reason: length) while the call was being written, so its "
                      "arguments may be incomplete; it was not run. Send the whole call again")
    if isinstance(raw, dict):
        return raw, None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if not isinstance(raw, str):
        return None, "the arguments must be a JSON object"
    try:
        # the standard library keeps a big integer's every digit (orjson would make it a float)
        parsed = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        return None, f"the arguments are not valid JSON ({_first_line(exc)})"
    if not isinstance(parsed, dict):
        return None, "the arguments must be a JSON object with one field per parameter"
    if nesting(parsed, MAX_DEPTH) > MAX_DEPTH:
        return None, f"the arguments are nested more than {MAX_DEPTH} levels deep"
    broken = unencodable(parsed)
    if broken is not None:
        return None, (f"the arguments hold a string that is not valid text ({broken}: a lone surrogate escape, "
                      "half of a character); send the characters themselves")
    return parsed, None


class _Ambiguous(ValueError):
    pass


def ambiguous_keys(raw: Any) -> str | None:
    """What in an agent's call's arguments another parser could read otherwise than the rules do: a key twice in
    one object (the rules read the last copy, some parsers the first) or two keys equal but for case (Go matches
    a struct's fields in any case, a long s for an s too); None when there is nothing such."""
    try:
        if isinstance(raw, str):
            json.loads(raw, object_pairs_hook=_distinct_pairs)
        elif isinstance(raw, (dict, list)):
            _distinct_keys(raw)
    except _Ambiguous as exc:
        return str(exc)
    except (ValueError, RecursionError):
        return None  # not JSON: parse_arguments says so
    return None


def _distinct_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, str] = {}
    for key, _ in pairs:
        folded = key.casefold()
        if folded in seen:
            raise _Ambiguous(f"the arguments hold the key {printable(seen[folded])[:40]!r} and the key "
                             f"{printable(key)[:40]!r}, which some parsers read as one")
        seen[folded] = key
    return dict(pairs)


def _distinct_keys(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            _distinct_pairs(list(item.items()))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def check_arguments(tool: ToolSpec, arguments: dict[str, Any]) -> Checked:
    checked = Checked()
    for name in arguments:
        if name not in tool.parameters:
            known = ", ".join(tool.parameters) or "none"
            checked.problems.append(f"{name} is not a parameter of {tool.name} (its parameters: {known})")
    for name, param in tool.parameters.items():
        value = arguments.get(name)
        if value is None:
            if param.has_default and param.default is not None:
                checked.values[name] = param.default
            elif param.is_required:
                checked.problems.append(f"{name} is missing; it is required")
            continue
        coerced, problem = _coerce(name, param, value)
        if problem:
            checked.problems.append(problem)
        else:
            checked.values[name] = coerced
    if checked.problems:
        _name_packed_fields(tool, arguments, checked)
    return checked


def _coerce(name: str, param: Parameter, value: Any) -> tuple[Any, str | None]:
    if param.type == "array":
        if not isinstance(value, list):
            return None, f"{name} must be an array of {param.items} values, got {_show(value)}"
        items = []
        for position, item in enumerate(value):
            coerced, problem = _coerce_scalar(f"{name}[{position}]", param.items, item)
            if problem:
                return None, problem
            items.append(coerced)
        return items, None
    if param.type == "object":
        if not isinstance(value, dict):
            return None, f"{name} must be an object, got {_show(value)}"
        return value, None
    coerced, problem = _coerce_scalar(name, param.type, value)
    if problem:
        return None, problem
    return coerced, _check_rules(name, param, coerced)


def _coerce_scalar(name: str, kind: str, value: Any) -> tuple[Any, str | None]:
    if kind == "string":
        if isinstance(value, str):
            return value, None
        return None, f"{name} must be a string, got {_show(value)}; write it in quotes"
    if kind == "boolean":
        if isinstance(value, bool):
            return value, None
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true", None
        return None, f"{name} must be true or false, got {_show(value)}"
    if isinstance(value, bool):
        return None, f"{name} must be a number, got {_show(value)}"
    if kind == "integer":
        if isinstance(value, int):
            return value, None
        if isinstance(value, float) and value.is_integer() and abs(value) <= EXACT_FLOAT:
            return int(value), None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return None, (f"{name} is too large to be exact as written ({_show(value)}); "
                          "write the whole number with all its digits")
        if isinstance(value, str) and INTEGER_TEXT.match(value):
            return int(value), None
        return None, f"{name} must be a whole number like 3, got {_show(value)}"
    # number
    if isinstance(value, str) and NUMBER_TEXT.match(value):
        text = value.strip()
        value = int(text) if INTEGER_TEXT.match(text) else float(text)
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return value, None
    return None, f"{name} must be a number like 2.5, got {_show(value)}"


def _check_rules(name: str, param: Parameter, value: Any) -> str | None:
    if param.enum is not None and value not in param.enum:
        allowed = ", ".join(render_scalar(v) for v in param.enum)
        return f"{name} must be one of: {allowed}; got {_show(value)}"
    if param.pattern and isinstance(value, str) and not re.search(param.pattern, value):
        return f"{name} must match the regular expression {param.pattern}; got {_show(value)}"
    if param.minimum is not None and value < param.minimum:
        return f"{name} must be at least {render_scalar(param.minimum)}; got {_show(value)}"
    if param.maximum is not None and value > param.maximum:
        return f"{name} must be at most {render_scalar(param.maximum)}; got {_show(value)}"
    return None


def _name_packed_fields(tool: ToolSpec, arguments: dict[str, Any], checked: Checked) -> None:
    """Small models pack every argument into one field: say so, naming the field."""
    missing = {name for name, p in tool.parameters.items() if p.is_required and arguments.get(name) is None}
    for name, value in arguments.items():
        if not isinstance(value, str):
            continue
        packed = [other for other in missing if other != name and re.search(rf"\b{re.escape(other)}\b", value, re.I)]
        if packed:
            checked.problems.append(
                f"{name} seems to hold several values ({', '.join(sorted(packed))} too); "
                "put each value in its own field"
            )


def _show(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return dumps(value).decode()


def invalid_call_answer(tool: ToolSpec, sent: Any, problems: list[str]) -> str:
    """The tool result for an invalid call: what was wrong, what was sent, what to send."""
    quoted = sent if isinstance(sent, str) else dumps(sent).decode()
    if len(quoted) > QUOTE_LIMIT:
        quoted = quoted[:QUOTE_LIMIT] + f"... ({len(quoted) - QUOTE_LIMIT} more characters)"
    lines = [f"Error: the call to {tool.name} was not run:"]
    lines += [f"- {problem}" for problem in problems]
    lines.append(f"You sent: {tool.name}({quoted})")
    lines.append(parameter_list(tool))
    lines.append("Fix the call and send it again.")
    return "\n".join(lines)


def parameter_list(tool: ToolSpec) -> str:
    if not tool.parameters:
        return f"{tool.name} takes no parameters; send {{}}."
    lines = [f"{tool.name} takes these parameters. {CLOSING_SENTENCE}"]
    for name, param in tool.parameters.items():
        kind = f"array of {param.items}" if param.type == "array" else param.type
        words = " ".join(constraint_words(param))
        description = f" {param.description.strip()}" if param.description.strip() else ""
        lines.append(f"- {name} ({kind}): {words}{description}")
    return "\n".join(lines)


@dataclass
class CheckedCall:
    """A declared call's arguments checked and its argv rendered, or the problems a model must fix."""

    quoted: Any  # what the model sent, as an invalid-call answer quotes it
    values: dict[str, Any] | None = None  # the coerced arguments, once they check
    argv: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_call(tool: DeclaredTool, sent: Any, *, truncated: bool = False) -> CheckedCall:
    """Parse, check and coerce what the model sent, and render the argv: the step every declared call takes
    before any policy sees it (serve, and `policy test`/`explain`)."""
    arguments, problem = parse_arguments(sent, truncated=truncated)
    if problem:
        return CheckedCall(sent, problems=[problem])
    checked = check_arguments(tool.spec, arguments)
    if not checked.ok:
        return CheckedCall(arguments, problems=checked.problems)
    try:
        return CheckedCall(arguments, checked.values, tool.template.render(checked.values))
    except RenderError as exc:
        return CheckedCall(arguments, checked.values, problems=[str(exc)])
