"""Configuration errors a person can act on: the file, the entry and the key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError


def regex(pattern: str | None) -> str | None:
    """A validator: the pattern, if it compiles."""
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
    return pattern


def describe(path: Path, raw: dict[str, Any], exc: ValidationError, *, entries: str, entry: str,
             name_key: str) -> str:
    """pydantic's errors as lines like `agent.yaml: tool 'release': key 'timeout': ...`.

    `entries` is the list an error may sit in (tools, rules), `entry` what one is
    called, `name_key` the key that names it (name, id).
    """
    lines = []
    for error in exc.errors():
        loc = list(error["loc"])
        where = str(path)
        if len(loc) >= 2 and loc[0] == entries and isinstance(loc[1], int):
            items = raw.get(entries) or []
            item = items[loc[1]] if loc[1] < len(items) else None
            name = item.get(name_key) if isinstance(item, dict) else None
            where += f": {entry} {name!r}" if name else f": {entry} #{loc[1] + 1}"
            loc = loc[2:]
        # pydantic names the branches of a union (function-..., literal[...]): not keys of the file
        key = ".".join(str(part) for part in loc if not str(part).startswith(("function-", "literal[")))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required key is missing"
        lines.append(f"{where}: key {key!r}: {message}" if key else f"{where}: {message}")
    return "\n".join(lines)
