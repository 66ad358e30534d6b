"""A word of a command line as bash makes it: quotes and backslashes removed, `$'...'` decoded, braces expanded;
None when it is known only at run time (a variable, a substitution). shell.py reads the words with these."""

from __future__ import annotations

import codecs
import itertools
import re

from tree_sitter import Node

HOME = ("$HOME", "${HOME}")


def text_of(node: Node) -> str:
    return node.text.decode("utf-8", "surrogatepass") if node.text is not None else ""


def words_of(node: Node) -> list[str | None]:
    """The words one argument becomes: one, or several when its braces expand; None for an unknowable one."""
    raw = text_of(node)
    if node.type in ("word", "concatenation") and "{" in raw and re.search(r"\{[^{}]*(,|\.\.)[^{}]*\}", raw):
        if re.search(r"[$`'\"\\]", raw):
            return [None]  # braces beside quotes or expansions: not worth guessing, and never an allow
        return [unescape(word) for word in expand_braces(raw)]
    return [literal(node)]


def literal(node: Node) -> str | None:
    """The word bash would make of this node, when it is known before the command runs."""
    kind, text = node.type, text_of(node)
    if kind == "word":
        return unescape(text)
    if kind == "number":
        return text
    if kind == "raw_string":
        return text[1:-1]
    if kind in ("string", "translated_string"):
        return _double_quoted(node)
    if kind == "ansi_c_string":
        return _ansi_c(text[2:-1])
    if kind == "concatenation":
        parts = [literal(child) for child in node.named_children]
        return None if any(part is None for part in parts) else "".join(parts)  # type: ignore[arg-type]
    if kind in ("simple_expansion", "expansion") and text in HOME:
        return "~"  # the agent's home: paths.py reads it so
    return None


def _double_quoted(node: Node) -> str | None:
    parts = []
    for child in node.named_children:
        if child.type == "string_content":
            parts.append(re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), text_of(child)))
        elif child.type in ("simple_expansion", "expansion") and text_of(child) in HOME:
            parts.append("~")
        else:
            return None
    return "".join(parts)


def unescape(text: str) -> str:
    """An unquoted word's backslashes as bash removes them (a backslash-newline is nothing)."""
    return re.sub(r"\\(.)", lambda m: "" if m.group(1) == "\n" else m.group(1), text, flags=re.DOTALL)


def _ansi_c(body: str) -> str | None:
    try:
        decoded = codecs.decode(body.replace("\\'", "'").encode("latin-1", "backslashreplace"), "unicode_escape")
        return decoded.split("\0", 1)[0]  # bash ends the word at a NUL (`$'rm\0x'` is rm)
    except (UnicodeDecodeError, ValueError):
        return None


def expand_braces(text: str, limit: int = 256) -> list[str]:
    """Bash's brace expansion of an unquoted word: `a{b,c}d` -> abd acd; `{1..3}` -> 1 2 3."""
    match = _innermost_braces(text)
    if match is None:
        return [text]
    start, end, choices = match
    results: list[str] = []
    for choice in choices:
        results.extend(expand_braces(text[:start] + choice + text[end:], limit))
        if len(results) > limit:
            break
    return results[:limit]


def _innermost_braces(text: str) -> tuple[int, int, list[str]] | None:
    for match in re.finditer(r"\{([^{}]*)\}", text):
        inner = match.group(1)
        if "," in inner:
            return match.start(), match.end(), inner.split(",")
        sequence = re.fullmatch(r"(-?\d+|[a-zA-Z])\.\.(-?\d+|[a-zA-Z])", inner)
        if sequence:
            return match.start(), match.end(), _sequence(*sequence.groups())
    return None


def _sequence(first: str, last: str) -> list[str]:
    if first.lstrip("-").isdigit() and last.lstrip("-").isdigit():
        low, high = int(first), int(last)
        step = 1 if high >= low else -1
        return [str(n) for n in itertools.islice(range(low, high + step, step), 256)]  # never the whole range
    step = 1 if ord(last) >= ord(first) else -1
    return [chr(n) for n in range(ord(first), ord(last) + step, step)]
