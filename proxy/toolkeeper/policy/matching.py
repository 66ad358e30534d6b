"""How far a rule's `matches:` reads: a regular expression's time may grow as a power of the text's length (`.*`
after `.*`), and Python holds the whole server while it searches, so a text past MAX_MATCHED characters is not
searched. It counts as matching a deny or an ask rule (fail closed, and the reason says why) and never an allow.

The bound lies past what a command line holds (Linux takes at most 128 KiB in one argument) and where the
expressions `policy import` writes, linear in the text, take a few milliseconds; rules imported before they were
linear (a `.*` between each wildcard) should be imported again.
"""

from __future__ import annotations

import re

MAX_MATCHED = 64 * 1024  # characters


def searched(pattern: str, text: str, restricts: bool, notes: list[str]) -> bool:
    """`pattern` found in `text`; a text past MAX_MATCHED found for a rule that `restricts` (noted) and not for an
    allow."""
    if len(text) <= MAX_MATCHED:
        return re.search(pattern, text) is not None
    if restricts:
        notes.append(f"a value is longer than {MAX_MATCHED:,} characters, more than a `matches:` test reads, so it "
                     "counts as matching")
    return restricts
