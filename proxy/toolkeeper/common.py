"""What every layer shares, and nothing else: it imports nothing of toolkeeper.

- canonical JSON and its SHA-256: one encoding wherever a value is hashed
  (approvals, the retry memo, the audit chain);
- strict configuration (`Strict`, `load_yaml_model`, `regex`, `describe`): kept
  in toolkeeper.strict, with pydantic and YAML, and given here when first asked
  for, so that what needs only the rest (`toolkeeper hook`, run before every
  tool call of an agent) does not import them;
- the files toolkeeper ships (the example agent, the default policy), found in
  a checkout or in the installed wheel;
- whether a host name or address is this machine's loopback;
- the one grammar of a time a person gives (`7d` ago, or an ISO time), for the
  CLI, the console and the export alike.
"""

from __future__ import annotations

import hashlib
import importlib
import ipaddress
import json
import re
import time
import unicodedata
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # given by __getattr__ below
    from toolkeeper.strict import Model, Strict, describe, load_yaml_model, regex  # noqa: F401


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


_STRICT = ("Model", "Strict", "describe", "load_yaml_model", "regex")


def __getattr__(name: str) -> Any:
    """toolkeeper.strict's names, imported when first used (PEP 562): pydantic and YAML cost a hook 50 ms."""
    if name not in _STRICT:
        raise AttributeError(f"module 'toolkeeper.common' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module("toolkeeper.strict"), name)
    return value
