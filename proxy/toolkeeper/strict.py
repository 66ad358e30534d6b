"""Strict configuration: a frozen pydantic base that refuses unknown keys, and one path from a YAML file to a
validated model whose errors name the file, the entry and the key (agent files, rules, scenarios).

It imports nothing of toolkeeper. `toolkeeper.common` gives these names too, importing this module (pydantic and
YAML) only when one is first used.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """A configuration entry: frozen once loaded, and an unknown key is an error, not ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def regex(pattern: str | None) -> str | None:
    """A validator: the pattern, if it compiles."""
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
    return pattern


Model = TypeVar("Model", bound=BaseModel)


def load_yaml_model(path: Path, model: type[Model], error: type[Exception], *, what: str, entries: str = "",
                    entry: str = "", name_key: str = "", override: dict[str, Any] | None = None,
                    ) -> tuple[Model, bytes, dict[str, Any]]:
    """Read, parse and validate a YAML mapping: (the model, the file's bytes, the raw mapping), or raise `error`.

    `what` names the file for people ("the agent file"); `entries`, `entry` and
    `name_key` say which list an error may sit in, so it can name the entry.
    """
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise error(f"{path}: {what} must be a mapping of keys")
    if override:
        raw = {**raw, **override}
    try:
        return model.model_validate(raw), text, raw
    except ValidationError as exc:
        raise error(describe(path, raw, exc, entries=entries, entry=entry, name_key=name_key)) from None


def describe(path: Path, raw: dict[str, Any], exc: ValidationError, *, entries: str = "", entry: str = "",
             name_key: str = "") -> str:
    """pydantic's errors as lines like `agent.yaml: tool 'release': key 'timeout': ...`."""
    lines = []
    for error in exc.errors():
        loc = list(error["loc"])
        where = str(path)
        if entries and len(loc) >= 2 and loc[0] == entries and isinstance(loc[1], int):
            items = raw.get(entries) or []
            item = items[loc[1]] if loc[1] < len(items) else None
            name = item.get(name_key) if isinstance(item, dict) else None
            where += f": {entry} {name!r}" if name else f": {entry} #{loc[1] + 1}"
            loc = loc[2:]
        # pydantic names the branches of a union (function-..., literal[...]): not keys of the file
        key = ".".join(str(part) for part in loc if not str(part).startswith(("function-", "literal[", "tuple[")))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required key is missing"
        lines.append(f"{where}: key {key!r}: {message}" if key else f"{where}: {message}")
    return "\n".join(lines)
