"""Redaction: secret-named values replaced before a record, a log line or an approval reaches anyone.

A value whose name matches a pattern (DEFAULT_PATTERNS; `--redact` adds
patterns, `--redact-only` replaces them) is replaced at any depth, and
everything under it goes too: each element of a secret-named array, each
field of a secret-named object. Its text is then erased from every other
argument's text (`"note": "uses [redacted] here"`, a command line), from the
argv and from the answer the model read. Redaction never fails open:

- arguments the model cut off (not valid JSON) are redacted in their text:
  a secret-named key's value is replaced up to where it ends, and when that
  value is an object or an array, the rest of the text goes;
- a secret shorter than `MIN_ERASE` characters ("x") is erased only where it
  fills an argv entry or stands after `=` (`--token=x`), so that it does not
  erase every "x" of unrelated text.

A pattern matches a name by its words, not by its letters: a name is split
into words at every character that is not a letter or a digit, where
camelCase turns and between letters and digits (`x-api-key`, `api_key`,
`apiKey`, `APIKey2` all hold the word `key`), and a pattern's words must stand
together in it, the last one maybe plural (`keys`, `tokens`). A pattern's word
may hold `*` (`cred*` matches `credentials`).

The defaults read a name run together without a break (`githubtoken`,
`DBPASSWORD`) by its last part, as English names a thing by its last noun: a
word ending in token, secret, password, passwd, passphrase, credential or
authorization (maybe plural) is a secret (`githubtoken`, `clientsecret`,
`dbpassword`; not `tokenizer`, `secretary` or `tokenfile`); `key` is one as a
word of its own, or at the end of a word after a qualifier that makes it a
secret's (api, access, secret, private, ssh, signing, encryption, master,
session, auth: `apikey`, `sshkey`; not `monkey`, `hotkey`, `keyword` or
`keyboard_layout`).

The record lists the paths it redacted.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from toolkeeper.audit.record import ExecutionRecord
from toolkeeper.common import unencodable

SECRET_NOUNS = ("token", "secret", "password", "passwd", "passphrase", "credential", "authorization")
KEY_QUALIFIERS = ("api", "access", "secret", "private", "ssh", "signing", "encryption", "master", "session", "auth")
# a word, or a name run together, ending in a secret's noun (githubtoken, dbpassword); `key` alone or after a
# qualifier (apikey, sshkey): never monkey or hotkey
DEFAULT_PATTERNS = ("key", *(f"*{noun}" for noun in SECRET_NOUNS), *(f"*{word}key" for word in KEY_QUALIFIERS))
REDACTED = "[redacted]"
MIN_ERASE = 4
NAMES_KEPT = 4096  # names already read, secret or not: the same few keys come back with every call

# In text that is not valid JSON: `"name": value`, the value a string (maybe cut off), a bare scalar, or the
# opening of an object or array.
_MEMBER = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:\s*("(?:[^"\\]|\\.)*(?:"|$)|[\[{]|[^,}\]\s]+)')


# A name's words: split where camelCase turns (apiKey, APIKey) and letters meet digits (token2), then at anything
# that is not a letter or a digit; a pattern's `*` and `?` stay inside its words.
_WORD_TURN = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])"
                        r"|(?<=[A-Za-z])(?=[0-9])|(?<=[0-9])(?=[A-Za-z])")
_NAME_BREAKS = re.compile(r"[\W_]+")
_PATTERN_BREAKS = re.compile(r"[^\w*?]+|_+")


def words(name: str, *, pattern: bool = False) -> tuple[str, ...]:
    """A name's words, in lowercase (`x-api-key`, `api_key`, `apiKey`: x, api, key); a `pattern`'s keep their `*`
    and `?`."""
    breaks = _PATTERN_BREAKS if pattern else _NAME_BREAKS
    return tuple(word.lower() for word in breaks.split(_WORD_TURN.sub(" ", name)) if word)


class Redactor:
    def __init__(self, patterns: Iterable[str] = DEFAULT_PATTERNS, scrub: Callable[[str], str] | None = None):
        patterns = tuple(patterns)
        self.patterns = patterns
        self.pattern_words = [found for found in (words(p, pattern=True) for p in patterns) if found]
        # secrets found by what they look like, whatever their name (a key in a command line, a token in a result):
        # the composition root gives the policy's detector, which this layer does not know
        self.scrub = scrub
        self._names: dict[str, bool] = {}

    @classmethod
    def from_settings(cls, add: Iterable[str] = (), only: Iterable[str] = (),
                      scrub: Callable[[str], str] | None = None) -> Redactor:
        only = tuple(only)
        return cls(only if only else (*DEFAULT_PATTERNS, *add), scrub)

    def secret_name(self, name: str) -> bool:
        """The name holds a pattern's words, side by side (the last one maybe plural)."""
        known = self._names.get(name)
        if known is None:
            held = words(name)
            known = any(_holds(held, wanted) for wanted in self.pattern_words)
            if len(self._names) >= NAMES_KEPT:
                self._names.clear()
            self._names[name] = known
        return known

    # -- values -----------------------------------------------------------------------

    def value(self, value: Any, path: str, secrets: list[str], paths: list[str]) -> Any:
        """`value` with every secret-named member replaced; their texts go to `secrets`, their paths to `paths`."""
        if isinstance(value, dict):
            out = {}
            for name, member in value.items():
                where = f"{path}.{name}"
                if self.secret_name(str(name)) and member not in (None, ""):
                    secrets.extend(_leaves(member))
                    paths.append(where)
                    out[name] = REDACTED
                else:
                    out[name] = self.value(member, where, secrets, paths)
            return out
        if isinstance(value, list):
            return [self.value(item, f"{path}[{i}]", secrets, paths) for i, item in enumerate(value)]
        return value

    def text(self, text: str, path: str, secrets: list[str], paths: list[str]) -> str:
        """Arguments that are not valid JSON (cut off by the model): secret-named values replaced in the text."""
        out, last = [], 0
        for match in _MEMBER.finditer(text):
            name, value = match.group(1), match.group(2)
            if not self.secret_name(name):
                continue
            paths.append(f"{path}.{name}")
            out.append(text[last:match.start(2)])
            if value in ("[", "{"):  # an object or array we cannot delimit: nothing after it is kept
                out.append(f'"{REDACTED}"')
                return "".join(out)
            secrets.append(value.strip('"'))
            out.append(f'"{REDACTED}"')
            last = match.end(2)
        out.append(text[last:])
        return "".join(out)

    def erase(self, text: str, secrets: Iterable[str]) -> str:
        """Each secret's text replaced; a short one only where it stands after `=` (`--token=x`)."""
        for secret in sorted(set(secrets), key=len, reverse=True):
            if len(secret) >= MIN_ERASE:
                text = text.replace(secret, REDACTED)
            elif secret:
                text = re.sub(rf"(?<==){re.escape(secret)}(?![A-Za-z0-9_-])", REDACTED, text)
        return text

    def erase_argv(self, argv: list[str], secrets: list[str]) -> list[str]:
        short = {s for s in secrets if s and len(s) < MIN_ERASE}
        erased = []
        for entry in argv:
            if entry in short:
                entry = REDACTED
            else:
                entry = self.erase(entry, secrets)
                head, sep, tail = entry.rpartition("=")
                if sep and tail in short:
                    entry = head + "=" + REDACTED
            erased.append(entry)
        return erased

    def erase_leaves(self, value: Any, secrets: list[str], path: str, paths: list[str]) -> Any:
        """Each secret's text erased from every text under `value` (a note, a command line); the paths erased from
        go to `paths`."""
        if isinstance(value, dict):
            return {name: self.erase_leaves(member, secrets, f"{path}.{name}", paths) for name, member in value.items()}
        if isinstance(value, list):
            return [self.erase_leaves(item, secrets, f"{path}[{i}]", paths) for i, item in enumerate(value)]
        if isinstance(value, str) and value != REDACTED:
            erased = self.erase(value, secrets)
            if erased != value:
                paths.append(path)
            return erased
        return value

    def shown(self, arguments: dict[str, Any], argv: list[str]) -> tuple[dict[str, Any], list[str]]:
        """Arguments and argv as a person or a log may see them."""
        secrets: list[str] = []
        clean = self.erase_leaves(self.value(arguments, "arguments", secrets, []), secrets, "arguments", [])
        argv = self.erase_argv(argv, secrets)
        return self.scrubbed(clean, "arguments", []), self.scrubbed(argv, "argv", [])

    # -- the record -------------------------------------------------------------------

    def apply(self, record: ExecutionRecord) -> ExecutionRecord:
        """The record as it may be stored: secret-named values replaced everywhere they appear."""
        secrets: list[str] = []
        paths: list[str] = []
        data = record.model_dump()
        for field in ("arguments_sent", "arguments"):
            value = data.get(field)
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                    readable = unencodable(value) is None  # a lone surrogate escape: no UTF-8 holds it parsed
                except (ValueError, RecursionError):
                    readable = False
                if not readable:
                    data[field] = self.text(data[field], field, secrets, paths)
                    continue
            data[field] = self.value(value, field, secrets, paths)
        policy_input = data.get("policy_input") or {}
        if isinstance(policy_input.get("arguments"), str):  # an agent's call cut off: its arguments are text
            policy_input["arguments"] = self.text(policy_input["arguments"], "policy_input.arguments", secrets, [])
        elif policy_input.get("arguments") is not None:
            policy_input["arguments"] = self.value(policy_input["arguments"], "policy_input.arguments", secrets, [])
        if secrets:  # a secret's text in another value: a note, a command line
            for field in ("arguments_sent", "arguments"):
                data[field] = self._erased(data.get(field), secrets, field, paths)
            if policy_input.get("arguments") is not None:
                policy_input["arguments"] = self._erased(policy_input["arguments"], secrets, "policy_input.arguments",
                                                         [])
        if data.get("argv"):
            data["argv"] = self.erase_argv(data["argv"], secrets)
        if policy_input.get("argv"):
            policy_input["argv"] = self.erase_argv(policy_input["argv"], secrets)
        data["answer"] = self.erase(data.get("answer") or "", secrets)
        if self.scrub is not None:
            for field in ("arguments_sent", "arguments", "argv", "answer"):
                data[field] = self.scrubbed(data.get(field), field, paths)
            for field in ("arguments", "argv"):
                if policy_input.get(field) is not None:
                    policy_input[field] = self.scrubbed(policy_input[field], f"policy_input.{field}", [])
        data["redacted"] = sorted(set(paths))
        return type(record).model_validate(data)

    def scrubbed(self, value: Any, path: str, paths: list[str]) -> Any:
        """Every text under `value` without the secrets the detector finds in it; where one was goes to `paths`."""
        if self.scrub is None:
            return value
        if isinstance(value, str):
            clean = self.scrub(value)
            if clean != value:
                paths.append(path)
            return clean
        if isinstance(value, dict):
            return {name: self.scrubbed(member, f"{path}.{name}", paths) for name, member in value.items()}
        if isinstance(value, list):
            return [self.scrubbed(item, f"{path}[{i}]", paths) for i, item in enumerate(value)]
        return value


    def _erased(self, value: Any, secrets: list[str], path: str, paths: list[str]) -> Any:
        if isinstance(value, str):  # arguments kept as text (not valid JSON)
            return self.erase(value, secrets)
        return self.erase_leaves(value, secrets, path, paths)


def _holds(held: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    """`wanted` words stand together among `held`, each as a glob, the last one maybe plural (key: keys)."""
    *leading, last = wanted
    for start in range(len(held) - len(wanted) + 1):
        here = held[start:start + len(wanted)]
        if all(fnmatch.fnmatchcase(word, glob) for word, glob in zip(here, leading, strict=False)) and any(
                fnmatch.fnmatchcase(here[-1], glob) for glob in (last, last + "s", last + "es")):
            return True
    return False


def _leaves(value: Any) -> list[str]:
    """Every scalar under a value, as text: what must not show anywhere else."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    if value is None or isinstance(value, bool):
        return []
    return [str(value)]
