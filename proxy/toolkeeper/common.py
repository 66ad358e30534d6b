"""What every layer shares, and nothing else: it imports nothing of toolkeeper.

- canonical JSON and its SHA-256: one encoding wherever a value is hashed
  (approvals, the retry memo, the audit chain);
- strict configuration: a frozen pydantic base that refuses unknown keys, and
  one path from a YAML file to a validated model whose errors name the file,
  the entry and the key (agent files, rules, scenarios);
- the files toolkeeper ships (the example agent, the default policy), found in
  a checkout or in the installed wheel;
- whether a host name or address is this machine's loopback;
- the one grammar of a time a person gives (`7d` ago, or an ISO time), for the
  CLI, the console and the export alike.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import time
import unicodedata
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


def canonical_json(value: Any) -> bytes:
    """One encoding for a value: sorted keys, no spaces (see `dumps` for what orjson cannot encode)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return _slow_dumps(value, sort_keys=True)


def dumps(value: Any) -> bytes:
    """JSON, fast; the standard library for what orjson refuses: integers past 64 bits (a model may send
    one, and its digits must survive) and nesting deeper than 255."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _slow_dumps(value, sort_keys=False)


def _slow_dumps(value: Any, *, sort_keys: bool) -> bytes:
    try:
        return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode()
    except RecursionError:
        raise ValueError("the value is nested too deeply to be written as JSON") from None


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """Text as a person may safely see it: control characters (ESC, CR, BEL, ...), bidirectional overrides
    (U+202E) and other invisible format characters written as escapes, so a value cannot rewrite a terminal
    line or reorder what a page shows."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if keep_newlines and char in "\n\t":
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cs"):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
TIME_GRAMMAR = "a number and a unit, like 7d, 12h or 30m (that long ago), or an ISO time like 2026-11-30T09:00"


def moment(text: str, now: float | None = None) -> float | None:
    """A time as a person gives it, the one grammar of the CLI's `--since`/`--until`, the console's trail filter and
    its export: `7d`, `12h`, `30m`, `45s`, `2w` (that long before `now`) or an ISO time (`2026-11-30T09:00`, local
    unless it gives its zone). Seconds since the epoch; None when it is neither (or a time no clock reaches)."""
    text = text.strip()
    ago = re.fullmatch(r"(\d{1,9})([smhdw])", text)
    if ago:
        return (time.time() if now is None else now) - int(ago.group(1)) * DURATION_UNITS[ago.group(2)]
    try:
        return datetime.fromisoformat(text).astimezone().timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def is_loopback(host: str) -> bool:
    """`localhost`, or a loopback address (`127.0.0.1`, `::1`, `[::1]`): a name that could be anyone's is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(*parts: str) -> str:
    """The SHA-256 of several strings, kept apart so ("ab", "c") differs from ("a", "bc")."""
    return sha256_hex("\x00".join(parts).encode())


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


def shipped_file(checkout: str, wheel: str) -> Path | None:
    """A file toolkeeper ships: `checkout` relative to the repository, or `wheel` inside the installed package."""
    package = Path(__file__).resolve().parent
    for candidate in (package.parent.parent / checkout, package / wheel):
        if candidate.is_file():
            return candidate
    return None


def unencodable(value: Any) -> str | None:
    """The first key or string (JSON's \\ud800 escapes parse to them) that no UTF-8 can encode, shown escaped."""
    stack = [value]
    while stack:
        item = stack.pop()
        texts = [*item.keys(), *item.values()] if isinstance(item, dict) else item if isinstance(item, list) else [item]
        for text in texts:
            if isinstance(text, str):
                try:
                    text.encode()
                except UnicodeEncodeError:
                    return ascii(text)[:60]
            elif isinstance(text, (dict, list)):
                stack.append(text)
    return None


def nesting(value: Any, limit: int) -> int:
    """How deeply a parsed JSON value nests, counted without recursion (it may be very deep) and no further than
    one past `limit`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def counted(number: int, noun: str) -> str:
    """`1 record`, `2 records`: a count as people read it."""
    return f"{number} {noun}{'' if number == 1 else 's'}"
