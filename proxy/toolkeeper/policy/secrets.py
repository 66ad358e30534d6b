"""Secrets in what goes to the model: found by detect-secrets' plugins, replaced by a marker naming their kind.

The detection is Yelp's detect-secrets, a maintained set of detectors, used
in process: each plugin's own expressions run over the whole text at once
(its per-line scan, with settings, filters and a result object per line, is
what makes it slow), and its own checks decide (a JWT's parts must decode, a
string's entropy must pass its limit). What toolkeeper adds:

- the span of each secret, so it can be replaced: a private key's whole PEM
  block (the plugin sees only its first line), a JWT with its signature (the
  plugin's expression stops before it), a URL's password and not its host;
- high-entropy strings unquoted too (a tool's output is not source code),
  between MIN_ENTROPY_LENGTH and MAX_ENTROPY_LENGTH characters: hexadecimal is
  never one (a commit id, a sha256 digest, a UUID), nor a digest named as one
  (`sha512-...` in a lock file, `sha256:...`, go.sum's `h1:...`), and a longer
  run is data (an image, a certificate), unless it decodes to a private key;
- a cache of the findings by a digest of the text: every request of a
  conversation resends the whole history, so each result is scanned once.

What a result becomes under each mode (redact, block, allow): secret_modes.py.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import hashlib
import itertools
import re
import string
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

MIN_ENTROPY_LENGTH = 20  # shorter runs are words and ids; a real key is longer
MAX_ENTROPY_LENGTH = 512  # longer runs of base64 are data: images, certificates, bundles
CACHE_ENTRIES = 4096  # results remembered by digest (a conversation's history, many conversations over)
CACHE_MIN_LENGTH = 32  # shorter texts (a word, a status) are remembered apart: they would crowd the cache out
SHORT_ENTRIES = 256  # of those: the arguments and results of the last calls (each is scanned for several events)

# detect-secrets' plugin (module, class) -> the kind toolkeeper names; the plugins left out match words of prose
# or code (keyword, artifactory's AP...), or public data (ip_public); hexadecimal entropy matches every digest.
PLUGINS = {
    ("aws", "AWSKeyDetector"): "aws_access_key",
    ("private_key", "PrivateKeyDetector"): "private_key",
    ("github_token", "GitHubTokenDetector"): "github_token",
    ("gitlab_token", "GitLabTokenDetector"): "gitlab_token",
    ("slack", "SlackDetector"): "slack_token",
    ("stripe", "StripeDetector"): "stripe_key",
    ("jwt", "JwtTokenDetector"): "jwt",
    ("basic_auth", "BasicAuthDetector"): "basic_auth",
    ("openai", "OpenAIDetector"): "openai_key",
    ("pypi_token", "PypiTokenDetector"): "pypi_token",
    ("npm", "NpmDetector"): "npm_token",
    ("sendgrid", "SendGridDetector"): "sendgrid_key",
    ("twilio", "TwilioKeyDetector"): "twilio_key",
    ("discord", "DiscordBotTokenDetector"): "discord_token",
    ("azure_storage_key", "AzureStorageKeyDetector"): "azure_storage_key",
    ("mailchimp", "MailchimpDetector"): "mailchimp_key",
    ("square_oauth", "SquareOAuthDetector"): "square_oauth_secret",
    ("telegram_token", "TelegramBotTokenDetector"): "telegram_token",
}
# the plugins whose expression's first group is the secret itself (a URL's password, not its host); in the others a
# group is a token's prefix (ghp, glpat), and the whole match is the secret
SECRET_GROUP = frozenset({"basic_auth", "aws_access_key", "npm_token"})
# What a plugin's expression cannot match without (lowercase text: found in the text lowered; an expression: in
# the text): checked first, as an expression that begins with a class of characters, or ignores case, is tried at
# every position of the text, and costs ten times a search for a word.
HINTS: dict[tuple[str, int], str | re.Pattern[str]] = {
    ("aws_access_key", 1): "aws",
    ("slack_token", 0): "xox",
    ("slack_token", 1): "hooks.slack.com",
    ("stripe_key", 0): "k_live_",
    ("npm_token", 0): "/:_authtoken=",
    ("mailchimp_key", 0): re.compile(r"-us[0-9]"),
    ("telegram_token", 0): re.compile(r":[0-9A-Za-z_-]{35}"),
    ("discord_token", 0): re.compile(r"\.[a-zA-Z\d_-]{6}\.[a-zA-Z\d_-]{27}"),
}
_JWT_RUN = frozenset(string.ascii_letters + string.digits + "_-")  # what a JWT's first part is made of
_NPM_KEY = "/:_authToken="
HIGH_ENTROPY = "high_entropy_string"
KINDS: tuple[str, ...] = (*PLUGINS.values(), HIGH_ENTROPY)

# The plugin knows the first line of a key; the block runs to its END line (to the end of the text when cut off).
# after the header: its dashes, maybe headers (Proc-Type, Comment), then the key's base64, on lines that may be
# escaped (a JSON text's `\n`); or nothing at all (a text cut off right after the header)
_NEWLINE = r"(?:\r?\n|(?:\\r)?\\n)[ \t]*"
_PEM_BODY = re.compile(rf"[A-Z0-9 ]{{0,16}}+-{{0,5}}+ ?[ \t]*+(?:(?:{_NEWLINE})++"
                       rf"(?:[A-Za-z][A-Za-z-]*:[^\n\\]*+(?:{_NEWLINE})++){{0,8}}+[A-Za-z0-9+/=]{{32}}|[\s\"']*+$)")
_PUTTY_BODY = re.compile(rf": *+[\w@.-]++{_NEWLINE}")  # its key's type, then the key file's next line
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|---- END SSH2 ENCRYPTED PRIVATE KEY ----"
                      r"|Private-MAC: *[0-9a-fA-F]*")
# what the plugin's list lacks: PKCS#8's encrypted key, PuTTY's key file of version 3
_PEM_EXTRA = re.compile(r"BEGIN ENCRYPTED PRIVATE KEY|PuTTY-User-Key-File-3")
_JWT_TAIL = re.compile(r"[A-Za-z0-9_\-+/=]*")  # the signature, which the plugin's lazy expression leaves out
# the characters of base64 (and its URL-safe form), as bytes: every other byte becomes a space, and the runs are
# what `split` leaves (three times quicker than an expression, which tries each position of a short run again)
_RUN_BYTES = frozenset((string.ascii_letters + string.digits + "+/_-").encode())
_RUN_TABLE = bytes(byte if byte in _RUN_BYTES else 32 for byte in range(256))
_HEX = re.compile(r"[0-9a-fA-F\-]+")
_DIGEST_NAME = re.compile(r"(?:sha(?:1|224|256|384|512)|md5|blake2[bs]?|h1)[-:=]$", re.IGNORECASE)
_PEM_IN_BASE64 = "LS0tLS1CRUdJTi"  # "-----BEGIN" in base64
_PATH_PART = re.compile(r"[a-z][a-z-]{2,}|[0-9a-f]{7,}")
_WORD = re.compile(r"[A-Z]?[a-z]{3,}|[A-Z]{4,}(?![a-z])")


@dataclass(frozen=True, slots=True)
class Finding:
    """One secret in a text: its kind and where it stands (never its value)."""

    kind: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Redaction:
    """A text with each secret replaced by its marker, and what was found in it."""

    text: str
    findings: tuple[Finding, ...]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted({finding.kind for finding in self.findings}))


def marker(kind: str) -> str:
    return f"[REDACTED: {kind}]"


@functools.cache
def _detectors() -> tuple[tuple[str, Any], ...]:
    """The plugins, imported on first use: detect-secrets brings `requests` with it (a quarter of a second), which
    a command that scans nothing need not pay. `serve` loads them at start (`prepare`)."""
    import importlib

    return tuple((kind, getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)())
                 for (module, name), kind in PLUGINS.items())


@functools.cache
def _entropy() -> Any:
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

    return Base64HighEntropyString()


def prepare() -> None:
    """Load the plugins now, not in the first request that holds a tool result."""
    _detectors()
    _entropy()


def find(text: str) -> list[Finding]:
    """Every secret in `text`, in order, none overlapping another (the more specific kind wins over entropy)."""
    found = list(_plugin_findings(text))
    found += _entropy_findings(text, found)
    return _merged(found)


def _plugin_findings(text: str) -> Iterator[Finding]:
    lowered = text.lower()
    ends = _Ends(text)
    for kind, plugin in _detectors():
        for index, regex in enumerate(plugin.denylist):
            for match in _matches(kind, index, regex, text, lowered):
                start, end = _span(match) if kind in SECRET_GROUP else match.span()
                if kind == "private_key":
                    block = _pem_block(text, start, end, ends, putty=text.startswith("PuTTY", start))
                    if block is None:
                        continue
                    start, end = block
                elif kind == "jwt":
                    if not plugin.is_formally_valid(match.group(0)):
                        continue
                    end = _JWT_TAIL.match(text, end).end()  # type: ignore[union-attr]
                if end > start:
                    yield Finding(kind, start, end)
    for match in _PEM_EXTRA.finditer(text):
        block = _pem_block(text, match.start(), match.end(), ends, putty=match.group().startswith("PuTTY"))
        if block is not None:
            yield Finding("private_key", *block)


def _matches(kind: str, index: int, regex: re.Pattern[str], text: str, lowered: str) -> Iterator[re.Match[str]]:
    """A plugin's expression's matches in `text`: skipped when its hint is absent; tried only where a match can
    begin when trying it everywhere costs the square of a text written for it (`eyJeyJeyJ...`, a line of `//`)."""
    hint = HINTS.get((kind, index))
    if hint is not None and (hint not in lowered if isinstance(hint, str) else hint.search(text) is None):
        return
    if kind == "jwt":  # at the start of a run only (the plugin's expression tried at each `eyJ` of one: its square)
        at = text.find("eyJ")
        while at != -1:
            match = regex.match(text, at) if at == 0 or text[at - 1] not in _JWT_RUN else None
            if match is not None:
                yield match
            at = text.find("eyJ", at + 3)
    elif kind == "npm_token":  # `//.+/:_authToken=...` ends its line: one try a line, from its first `//`
        at = text.find(_NPM_KEY)
        while at != -1:
            start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
            end = len(text) if end == -1 else end
            slashes = text.find("//", start, at + 1)
            match = regex.match(text, slashes, end) if slashes != -1 else None
            if match is not None:
                yield match
            at = text.find(_NPM_KEY, end)
    else:
        yield from regex.finditer(text)


class _Ends:
    """Where the private keys' END lines stand, found once a text: a text of many BEGIN lines and no END (written
    to make the scan slow) costs one pass, not one to its end for each."""

    def __init__(self, text: str):
        self.text = text
        self._found: tuple[list[int], list[int]] | None = None

    def after(self, at: int) -> int:
        """The end of the first END line that begins at `at` or after; the end of the text when none does."""
        if self._found is None:
            spans = [match.span() for match in _PEM_END.finditer(self.text)]
            self._found = [start for start, _ in spans], [end for _, end in spans]
        starts, ends = self._found
        index = bisect.bisect_left(starts, at)
        return ends[index] if index < len(ends) else len(self.text)


def _span(match: re.Match[str]) -> tuple[int, int]:
    """The secret a match holds: its first group that matched (a URL's password, a quoted key), else all of it."""
    for group in range(1, (match.re.groups or 0) + 1):
        if match.group(group):
            return match.span(group)
    return match.span()


def _pem_block(text: str, at: int, header_end: int, ends: _Ends, putty: bool = False) -> tuple[int, int] | None:
    """A private key's block, from the dashes before its BEGIN to its END line (to the end of a text cut off);
    None for a header that no key follows (a program or a page that names the header). A PuTTY key file runs
    from its first line to its Private-MAC."""
    body = (_PUTTY_BODY if putty else _PEM_BODY).match(text, header_end)
    if body is None:
        return None
    body_end = body.end()
    start = at
    while start > 0 and at - start < 6 and text[start - 1] in "- ":  # its dashes: `-----BEGIN`, `---- BEGIN`
        start -= 1
    return start, ends.after(body_end)


def _entropy_findings(text: str, known: list[Finding]) -> Iterator[Finding]:
    plugin = _entropy()
    limit = plugin.entropy_limit
    fewest = int(2 ** limit) + 1  # a run of fewer distinct characters cannot pass the limit (log2 of their count)
    covered = _merged(known)  # apart and in order: looked up by halves (thousands of tokens cost no square)
    starts = [finding.start for finding in covered]
    for start, end in _runs(text):
        run = text[start:end]
        if _PEM_IN_BASE64 in run[:24] and _decodes_to_private_key(run):
            yield Finding("private_key", start, end)
            continue
        if end - start > MAX_ENTROPY_LENGTH:
            continue
        if len(set(run)) < fewest or _HEX.fullmatch(run) or _named_digest(text, start, run) or _written(run):
            continue
        index = bisect.bisect_right(starts, start) - 1
        if (index >= 0 and covered[index].end > start) or (index + 1 < len(starts) and starts[index + 1] < end):
            continue  # a plugin's finding already covers it
        if plugin.calculate_shannon_entropy(run) > limit:
            yield Finding(HIGH_ENTROPY, start, end)


def _runs(text: str) -> Iterator[tuple[int, int]]:
    """Where the runs of base64 characters of MIN_ENTROPY_LENGTH or more stand, each with its padding (`=`)."""
    # one byte a character (any other than ASCII becomes `?`), so a byte's offset is its character's
    data = text.encode("ascii", "replace").translate(_RUN_TABLE)
    at = 0
    for run in data.split():
        if len(run) < MIN_ENTROPY_LENGTH:
            continue
        start = data.find(run, at)
        end = at = start + len(run)
        while end < len(text) and end - at < 2 and text[end] == "=":
            end += 1
        yield start, end


def _written(run: str) -> bool:
    """A run a person or a program wrote, not a random one: an alphabet (`ABCDEFGH...`), a path or a link's
    (`com/python/cpython/blob/<commit>/Lib`: two of its parts words or commits), a CamelCase name. Measured on
    random keys: none of these holds for one in 10,000."""
    if _ascending(run):
        return True
    if "/" in run and sum(1 for part in run.split("/") if _PATH_PART.fullmatch(part)) >= 2:
        return True
    return sum(len(word) for word in _WORD.findall(run)) >= 0.9 * len(run)


def _ascending(run: str, length: int = 8) -> bool:
    chain = 1
    for before, after in itertools.pairwise(run):
        chain = chain + 1 if ord(after) == ord(before) + 1 else 1
        if chain >= length:
            return True
    return False


def _named_digest(text: str, start: int, run: str) -> bool:
    """A digest written with its algorithm (a lock file's `sha512-...`, `sha256:...`, go.sum's `h1:...`)."""
    head, dash, _ = run.partition("-")
    return bool(dash and _DIGEST_NAME.match(head + "-")) or bool(_DIGEST_NAME.search(text[max(0, start - 8):start]))


def _decodes_to_private_key(run: str) -> bool:
    try:
        head = base64.b64decode(run[:96] + "=" * (-len(run[:96]) % 4), validate=False)
    except (binascii.Error, ValueError):
        return False
    return b"PRIVATE KEY" in head


def _merged(found: list[Finding]) -> list[Finding]:
    """In order; of overlapping findings the one that starts first, grown to cover the others (a key's block
    holds the high-entropy lines inside it)."""
    merged: list[Finding] = []
    for finding in sorted(found, key=lambda f: (f.start, -f.end)):
        if merged and finding.start < merged[-1].end:
            last = merged[-1]
            if finding.end > last.end:
                merged[-1] = Finding(last.kind, last.start, finding.end)
            continue
        merged.append(finding)
    return merged


def redact(text: str) -> tuple[str, list[Finding]]:
    """`text` with each secret replaced by `[REDACTED: <kind>]`, and the findings (positions in `text`)."""
    found = find(text)
    return (_replaced(text, found) if found else text), found


def _replaced(text: str, found: Iterable[Finding]) -> str:
    out, at = [], 0
    for finding in found:
        out += (text[at:finding.start], marker(finding.kind))
        at = finding.end
    out.append(text[at:])
    return "".join(out)


class _Cache:
    """Findings by a digest of their text, the most recently used kept: a history's results come back with every
    request of the conversation. Only the findings are kept (positions, never a secret, and a few bytes), not the
    text: the redacted text is made again from them."""

    def __init__(self, entries: int = CACHE_ENTRIES):
        self.entries = entries
        self._kept: OrderedDict[bytes, tuple[Finding, ...]] = OrderedDict()
        self._lock = threading.Lock()  # the trail's writes may scan in a thread of their own

    def findings(self, text: str) -> tuple[Finding, ...]:
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return kept
        kept = tuple(find(text))
        with self._lock:
            self._kept[key] = kept
            while len(self._kept) > self.entries:
                self._kept.popitem(last=False)
        return kept

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


CACHE, SHORT = _Cache(), _Cache(SHORT_ENTRIES)


def redaction(text: str) -> Redaction:
    """`redact`, its findings remembered by the text's digest: the same text again costs a hash."""
    found = (CACHE if len(text) >= CACHE_MIN_LENGTH else SHORT).findings(text)
    return Redaction(_replaced(text, found) if found else text, found)


def scrub(text: str) -> str:
    """`text` as the trail may keep it: no secret the detector finds."""
    return redaction(text).text
