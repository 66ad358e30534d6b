"""argv templates: `["./release.sh", "{{version}}", "--channel={{channel}}"]`.

No shell ever sees these. A value replaces its placeholder inside one entry and
never splits it, so `1.4.2; rm -rf ~` reaches the program as one odd string.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class TemplateError(ValueError):
    """The command template itself is wrong (found at load)."""


class RenderError(ValueError):
    """A value cannot go into argv (found per call); the model is told why."""


def render_scalar(value: Any) -> str:
    """A value as JSON writes a scalar: true/false, 3, 2.5; strings as they are; an integer with all its digits."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return orjson.dumps(value).decode()


@dataclass(frozen=True)
class Entry:
    text: str
    placeholders: tuple[str, ...]

    @property
    def whole(self) -> str | None:
        """The parameter name when the entry is exactly one placeholder."""
        match = PLACEHOLDER.fullmatch(self.text)
        return match.group(1) if match else None


@dataclass(frozen=True)
class CommandTemplate:
    entries: tuple[Entry, ...]
    allow_dash: frozenset[str]
    arrays: frozenset[str]

    @property
    def program(self) -> str:
        return self.entries[0].text

    @property
    def placeholders(self) -> frozenset[str]:
        return frozenset(name for entry in self.entries for name in entry.placeholders)

    @classmethod
    def parse(cls, command: tuple[str, ...], parameters: Mapping[str, Any]) -> CommandTemplate:
        if not command or not command[0].strip():
            raise TemplateError("the first entry must name the program")
        entries = []
        for position, text in enumerate(command):
            names = tuple(PLACEHOLDER.findall(text))
            leftover = PLACEHOLDER.sub("", text)
            if "{{" in leftover or "}}" in leftover:
                raise TemplateError(f"entry {text!r} has a malformed placeholder; write {{{{name}}}}")
            if position == 0 and names:
                raise TemplateError("the program (first entry) cannot come from a placeholder")
            for name in names:
                if name not in parameters:
                    raise TemplateError(f"placeholder {{{{{name}}}}} names no declared parameter")
                kind = parameters[name].type
                if kind == "object":
                    raise TemplateError(f"{{{{{name}}}}} is an object; objects reach the tool through `stdin: json`")
                if kind == "array" and PLACEHOLDER.fullmatch(text) is None:
                    raise TemplateError(f"the array {{{{{name}}}}} must be a whole entry (one entry per element)")
            entries.append(Entry(text, names))
        return cls(
            entries=tuple(entries),
            allow_dash=frozenset(name for name, p in parameters.items() if p.allow_dash),
            arrays=frozenset(name for name, p in parameters.items() if p.type == "array"),
        )

    def render(self, values: Mapping[str, Any]) -> list[str]:
        """argv for coerced values; absent optional values drop their entries."""
        argv: list[str] = []
        for entry in self.entries:
            if not entry.placeholders:
                argv.append(entry.text)
                continue
            if any(values.get(name) is None for name in entry.placeholders):
                continue
            whole = entry.whole
            if whole in self.arrays:
                argv.extend(self._checked(whole, render_scalar(item)) for item in values[whole])
                continue
            text = PLACEHOLDER.sub(lambda m: render_scalar(values[m.group(1)]), entry.text)
            argv.append(self._checked(_first(entry, values), text, literal_dash=entry.text.startswith("-")))
        return argv

    def _checked(self, name: str, text: str, *, literal_dash: bool = False) -> str:
        """An entry whose template text does not start with '-' never renders to one that does, unless the
        parameter at its start allows it: a value cannot pose as an option, whole or as a prefix."""
        if "\x00" in text:
            raise RenderError(f"{name} contains a NUL character, which no program argument can hold")
        if text.startswith("-") and not literal_dash and name not in self.allow_dash:
            raise RenderError(
                f"{name} starts with '-' ({text!r}), so the program would read it as an option; "
                "give a value that does not start with '-'"
            )
        return text


def _first(entry: Entry, values: Mapping[str, Any]) -> str:
    """The parameter whose value starts the rendered entry (an empty value lets the next one start it)."""
    match = PLACEHOLDER.match(entry.text)
    while match is not None:
        name = match.group(1)
        if render_scalar(values[name]):
            return name
        match = PLACEHOLDER.match(entry.text, match.end())
    return entry.placeholders[0]
