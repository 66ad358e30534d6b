"""Patterns compared with patterns: could `.env*` in a command and a rule's `.env` name the same file?

A pattern is read as bash expands a word and as fnmatch reads a rule's glob: `*` any run of characters,
`?` any one, `[...]` one of a set (`[!...]` and `[^...]` the others, `a-z` a range). Two patterns overlap
when some name matches both; that is decided by walking both at once (the product of their automata), never
by listing names, so it is exact for what it reads. What it does not read is read wider than it is (a
character class `[[:alpha:]]` as any character; a word with an extended glob `@(...)` as anything), so an
answer can only err toward "could match", which a deny rule counts as a match and an allow rule never does.

Case is folded: on macOS's file system `.ENV` is `.env` (elsewhere a near miss counts, which fails closed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

MAGIC = re.compile(r"[*?\[]")
EXTENDED = re.compile(r"[*?+@!]\(")  # bash's extglob, zsh's qualifiers: read as "anything"
WIDEST_RANGE = 512  # a range wider than this is read as any character
MOST_BRACES = 64  # a brace expression with more alternatives is not listed: its answer is "could match"


@dataclass(frozen=True)
class _Char:
    """One character of a pattern: a set of characters (or, `negated`, everything but them)."""

    chars: frozenset[str]
    negated: bool = False

    def meets(self, other: _Char) -> bool:
        if self.negated and other.negated:
            return True  # two complements of finite sets always share a character
        if self.negated or other.negated:
            inside, outside = (other, self) if self.negated else (self, other)
            return bool(inside.chars - outside.chars)
        return bool(self.chars & other.chars)


_Token = _Char | None  # None: a star
ANY = _Char(frozenset(), negated=True)


def has_magic(text: str) -> bool:
    return MAGIC.search(text) is not None


@lru_cache(maxsize=8192)
def overlap(word: str, glob: str) -> bool:
    """Whether some name matches both the pattern `word` (as bash reads it: `\\` escapes) and the glob `glob`
    (as fnmatch reads it). A wildcard may stand for a leading dot, as with bash's dotglob (a command can set it)."""
    if EXTENDED.search(word):
        return True
    return _meet(_tokens(word, escapes=True), _tokens(glob, escapes=False))


@lru_cache(maxsize=8192)
def matches(word: str, glob: str) -> bool:
    """Whether the literal `word` is a name `glob` matches (case folded)."""
    return _meet([_literal(ch) for ch in word.lower()], _tokens(glob, escapes=False))


def braces(text: str) -> list[str] | None:
    """The words a brace expression stands for (`*.{ts,tsx}`: `*.ts`, `*.tsx`), as the glob libraries of the
    agents' file tools expand it; None when there are too many to list."""
    found = [text]
    while True:
        expanded = []
        for word in found:
            parts = _first_braces(word)
            expanded.extend([word] if parts is None else parts)
            if len(expanded) > MOST_BRACES:
                return None
        if expanded == found:
            return found
        found = expanded


def _first_braces(word: str) -> list[str] | None:
    """The alternatives of the first `{a,b}` in `word` (nested braces kept for the next round); None: none."""
    depth, start, commas = 0, -1, []
    for index, ch in enumerate(word):
        if ch == "{":
            depth += 1
            start = index if depth == 1 else start
        elif ch == "," and depth == 1:
            commas.append(index)
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0 and commas:
                cuts = [start, *commas, index]
                head, tail = word[:start], word[index + 1:]
                return [head + word[a + 1:b] + tail for a, b in pairwise(cuts)]
            if depth == 0:
                commas = []
    return None


def _literal(ch: str) -> _Char:
    return _Char(frozenset(ch.lower()))


def _tokens(pattern: str, escapes: bool) -> list[_Token]:
    tokens: list[_Token] = []
    index = 0
    while index < len(pattern):
        ch = pattern[index]
        if ch == "*":
            if not tokens or tokens[-1] is not None:
                tokens.append(None)
            index += 1
        elif ch == "?":
            tokens.append(ANY)
            index += 1
        elif ch == "[":
            found, index = _bracket(pattern, index, escapes)
            tokens.append(found)
        elif ch == "\\" and escapes and index + 1 < len(pattern):
            tokens.append(_literal(pattern[index + 1]))
            index += 2
        else:
            tokens.append(_literal(ch))
            index += 1
    return tokens


def _bracket(pattern: str, start: int, escapes: bool) -> tuple[_Char, int]:
    """The set `[...]` at `start` stands for, and the index after it; a `[` that is never closed is itself."""
    index = start + 1
    negated = index < len(pattern) and pattern[index] in "!^"
    index += negated
    chars: set[str] = set()
    first = index
    while index < len(pattern) and (pattern[index] != "]" or index == first):
        ch = pattern[index]
        if ch == "[" and pattern[index + 1:index + 2] in (":", "=", "."):
            return ANY, _after_class(pattern, index)  # [[:alpha:]]: read as any character (wider)
        if ch == "\\" and escapes and index + 1 < len(pattern):
            index += 1
            ch = pattern[index]
        if pattern[index + 1:index + 2] == "-" and index + 2 < len(pattern) and pattern[index + 2] != "]":
            low, high = ord(ch), ord(pattern[index + 2])
            if high - low > WIDEST_RANGE:
                return ANY, _closing(pattern, index)
            chars.update(chr(code) for code in range(low, high + 1))
            index += 3
            continue
        chars.add(ch)
        index += 1
    if index >= len(pattern):
        return _literal("["), start + 1
    folded = frozenset(ch.lower() for ch in chars)
    return _Char(folded, negated), index + 1


def _after_class(pattern: str, index: int) -> int:
    end = pattern.find("]", index + 2)
    return _closing(pattern, end + 1 if end >= 0 else len(pattern))


def _closing(pattern: str, index: int) -> int:
    end = pattern.find("]", index)
    return end + 1 if end >= 0 else len(pattern)


_END = _Char(frozenset())  # past the last token: meets nothing


def _meet(left: list[_Token], right: list[_Token]) -> bool:
    """Whether one string matches both token lists: a search over pairs of positions."""
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        state = todo.pop()
        if state in seen:
            continue
        seen.add(state)
        i, j = state
        if i == len(left) and j == len(right):
            return True
        a = left[i] if i < len(left) else _END
        b = right[j] if j < len(right) else _END
        if a is None:
            todo += [(i + 1, j)] + ([(i, j + 1)] if b is not _END else [])  # the star stops, or takes b's char
        if b is None:
            todo += [(i, j + 1)] + ([(i + 1, j)] if a is not _END else [])
        if a is not None and b is not None and a is not _END and b is not _END and a.meets(b):
            todo.append((i + 1, j + 1))
    return False
