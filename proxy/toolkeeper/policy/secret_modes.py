"""What a tool's result becomes, under the mode its tool and the rules give it, before the model reads it.

    allow   passed as it is (still recorded as found; the trail keeps it redacted)
    redact  each secret replaced by `[REDACTED: <kind>]` (the default)
    block   the whole result withheld; the model is told why, naming the kinds

The strictest mode that applies wins: a tool's own `secrets:` (default
redact) and those of the rules that match its call (`Policy.secrets_mode`).

A result is a text, or what an API makes of one (a list of parts, an MCP
result): every string in it is read, but for the fields that carry no text
(an image's or a file's base64 data; a part's `type` and ids).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from toolkeeper.policy.flows import SECRETS_MODES as MODES  # from the loosest to the strictest
from toolkeeper.policy.secrets import Redaction, redaction

DEFAULT_MODE = "redact"
# fields that hold no text to read: binary data (base64: an image, a file), costly to read and no secret's usual
# place; and, in a part of a result (an object with a `type`), what the part is and its ids. Any other object (an
# MCP tool's structuredContent) is read whole.
BINARY = frozenset({"blob", "image_url", "file_data"})
UNREAD_IN_PARTS = BINARY | {"type", "id", "call_id", "tool_use_id", "media_type", "mimeType", "mime_type", "data",
                            "file_id", "cache_control"}


def strictest(*modes: str | None) -> str | None:
    """The strictest of the modes given (block > redact > allow); None when none is."""
    given = [mode for mode in modes if mode in MODES]
    return max(given, key=MODES.index) if given else None


@dataclass(frozen=True)
class Guarded:
    """A result as the model receives it, as the trail keeps it, and what was found in it."""

    value: Any  # what the model receives: the result, or (block) the notice that replaces it
    kept: Any  # what the trail keeps: never a secret
    findings: tuple[dict[str, str], ...] = ()  # {"kind", "where", "action"}: never the value
    mode: str = DEFAULT_MODE

    @property
    def text(self) -> str:
        return self.value if isinstance(self.value, str) else str(self.value)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted({finding["kind"] for finding in self.findings}))

    @property
    def changed(self) -> bool:
        """The model receives other than the tool gave."""
        return bool(self.findings) and self.mode != "allow"

    @property
    def withheld(self) -> bool:
        return bool(self.findings) and self.mode == "block"


def texts(value: Any, where: str = "result") -> Iterator[tuple[str, str]]:
    """Each string of a result that holds text, with where it stands (`result`, `result[0].text`)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        unread = UNREAD_IN_PARTS if "type" in value else BINARY
        for name, member in value.items():
            if name not in unread:
                yield from texts(member, f"{where}.{name}")
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield from texts(item, f"{where}[{position}]")


def scan(value: Any, where: str = "result") -> dict[str, Redaction]:
    """The redactions of a result's strings that hold a secret, by where they stand; empty (the usual case): none.
    Each string's findings are remembered by its digest (a history's results come back with every request)."""
    found = {}
    for path, text in texts(value, where):
        redacted = redaction(text)
        if redacted.findings:
            found[path] = redacted
    return found


def guard(value: Any, mode: str | None, where: str = "result", *,
          found: dict[str, Redaction] | None = None) -> Guarded:
    """A result under `mode` (None, or unknown: redact); `found`: its `scan`, when already made."""
    mode = mode if mode in MODES else DEFAULT_MODE
    found = scan(value, where) if found is None else found
    if not found:
        return Guarded(value, value, (), mode)
    findings = tuple({"kind": kind, "where": path, "action": mode}
                     for path, redacted in found.items() for kind in redacted.kinds)
    if mode == "block":
        notice = withheld_notice(sorted({finding["kind"] for finding in findings}))
        return Guarded(notice, notice, findings, mode)
    redacted = _replaced(value, where, lambda path, text: found[path].text if path in found else text)
    return Guarded(value if mode == "allow" else redacted, redacted, findings, mode)


def _replaced(value: Any, where: str, replace: Callable[[str, str], str]) -> Any:
    """`value` with each of its strings that holds text given by `replace(where, text)`; the rest as it was."""
    if isinstance(value, str):
        return replace(where, value)
    if isinstance(value, dict):
        unread = UNREAD_IN_PARTS if "type" in value else BINARY
        return {name: member if name in unread else _replaced(member, f"{where}.{name}", replace)
                for name, member in value.items()}
    if isinstance(value, list):
        return [_replaced(item, f"{where}[{position}]", replace) for position, item in enumerate(value)]
    return value


def scan_arguments(arguments: Any, where: str = "arguments") -> list[dict[str, str]]:
    """The secrets in a call's arguments, each {"kind", "where"} (`arguments.command`, `arguments.files[0]`);
    never the value. Every string is read (an argument's name says nothing of its value); arguments that are
    not JSON (a call cut off) are read as their text."""
    found: list[dict[str, str]] = []
    for path, text in _strings(arguments, where):
        found += [{"kind": kind, "where": path} for kind in redaction(text).kinds]
    return found


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for name, member in value.items():
            yield from _strings(member, f"{path}.{name}")
    elif isinstance(value, list | tuple):
        for position, item in enumerate(value):
            yield from _strings(item, f"{path}[{position}]")


def withheld_notice(kinds: tuple[str, ...] | list[str]) -> str:
    """What the model reads in place of a result the rules withhold."""
    return (f"Withheld by toolkeeper: this result holds secrets ({', '.join(kinds)}), and the rules do not let a "
            "result with secrets reach the model. Tell the user it was withheld and why; do not try to read the "
            "secret another way.")
