"""The sed scripts toolkeeper reads: commands with optional addresses that print, delete, quit, count or hold
lines (p d D q Q = n N g G h H x l z), and substitutions `s/RE/TEXT/` whose flags only choose what matches
(g p i I m M and a number). Any other script is not read: GNU sed's `e` command and `s///e` run a command,
`w FILE`, `r FILE` and `s///w FILE` read or write a file, and braces or labels are more than these few forms.
"""

from __future__ import annotations

import re

MAX_SCRIPT = 2000  # longer scripts are not read (the pattern below stays linear on what it reads)

_ADDRESS = r"(?:\d+(?:~\d+)?|\$|/(?:[^/\\\n]|\\.)*/I?)"
_RANGE = rf"(?:{_ADDRESS}(?:\s*,\s*(?:{_ADDRESS}|[+~]\d+))?\s*!?\s*)?"
# s, a delimiter that is neither a backslash nor a newline, then the pattern and the replacement in that delimiter
_SUBSTITUTE = r"s([^\\\n\w\s])(?:(?!\1)[^\\\n]|\\.)*\1(?:(?!\1)[^\\\n]|\\.)*\1[gpiImM0-9]*"
_COMMAND = re.compile(rf"\s*{_RANGE}(?:[pdDqQ=nNgGhHxlz]|{_SUBSTITUTE})\s*(?:[;\n]|$)")


def reads(script: str) -> bool:
    """Whether toolkeeper reads this sed script as one that only prints, deletes or substitutes text."""
    if len(script) > MAX_SCRIPT:
        return False
    at = 0
    while at < len(script):
        if script[at] in " \t\n;":
            at += 1
            continue
        command = _COMMAND.match(script, at)
        if command is None or command.end() == at:
            return False
        at = command.end()
    return True
