"""Claude Code's `permissions` (settings.json) as toolkeeper rules.

    {"permissions": {"allow": ["Bash(npm run test:*)"], "ask": ["Bash(git push:*)"],
                     "deny": ["Read(~/.ssh/**)", "WebFetch(domain:example.com)", "mcp__github"]}}

An entry is `Tool` or `Tool(specifier)`. Bash: `prefix:*` and `prefix *` (the
command, or it followed by arguments) become `runs: {prefix: [...]}`; an exact
command a regular expression on the whole line; other `*` wildcards a regular
expression (approximate). Read and Edit paths follow gitignore: `//abs`, `~/`,
`/` (the settings file's project), `./` or bare (the project too: toolkeeper
does not know where Claude Code started); a folder, or a folder's `**`, is
`under:`, other globs `under:` plus a regular expression (approximate).
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import posixpath
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from toolkeeper.policy.imports_base import (
    Call,
    ImportResult,
    PolicyImportError,
    Translation,
    agent_call,
    command_regex,
    each_command,
    glob_regex,
    make_rule,
    prefixes_test,
    shell_words,
    wildcard_fullmatch,
)

EFFECTS = ("allow", "ask", "deny")
SETTINGS = ("defaultMode", "additionalDirectories", "disableBypassPermissionsMode", "disableAutoMode")
# a rule's tool name: the tools it covers and the argument holding the path ("Edit" rules cover every editing tool)
PATH_TOOLS: dict[str, list[tuple[list[str], str]]] = {
    "Read": [(["Read"], "file_path"), (["Glob", "Grep"], "path")],
    "Edit": [(["Edit", "MultiEdit", "Write"], "file_path"), (["NotebookEdit"], "notebook_path")],
    "Write": [(["Write"], "file_path")],
    "MultiEdit": [(["MultiEdit"], "file_path")],
    "NotebookEdit": [(["NotebookEdit"], "notebook_path")],
}
ENTRY = re.compile(r"([A-Za-z][\w-]*)(?:\((.*)\))?", re.S)
GLOB = re.compile(r"[*?\[]")


def import_claude_code(text: str, source: Path, project_dir: Path | None = None) -> ImportResult:
    """The `permissions` of a Claude Code settings file (or a JSON object holding one) as rules."""
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyImportError(f"{source}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    permissions = settings.get("permissions") if isinstance(settings, dict) else None
    if not isinstance(permissions, dict):
        raise PolicyImportError(f"{source}: no `permissions` object (a Claude Code settings.json has one)")
    project = project_dir or (source.parent.parent if source.parent.name == ".claude" else source.parent)
    home = Path.home()
    base = "~" if project.resolve() == home.resolve() else project.resolve().as_posix()
    out = Translation(source, "claude")
    lines = _Lines(text)
    for key, entries in permissions.items():
        if key not in EFFECTS:
            why = "a setting, not a rule: not translated" if key in SETTINGS else "unknown key: not translated"
            out.warn(out.where(lines.find(key), f"permissions.{key}"), why)
            continue
        if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
            raise PolicyImportError(f"{source}:{lines.find(key)}: permissions.{key} must be a list of strings")
        for entry in entries:
            _entry(out, key, entry, out.where(lines.find(entry), f'{key} "{entry}"'), base)
    return out.result()


class _Lines:
    """The line of each entry, found in order in the file's text."""

    def __init__(self, text: str):
        self.text, self.at = text, 0

    def find(self, value: str) -> int | None:
        index = self.text.find(json.dumps(value), self.at)
        if index < 0:
            return None
        self.at = index + 1
        return self.text.count("\n", 0, index) + 1


def _entry(out: Translation, effect: str, entry: str, where: str, base: str) -> None:
    parsed = ENTRY.fullmatch(entry.strip())
    if parsed is None:
        out.warn(where, "not a rule Claude Code reads (Tool or Tool(specifier)): not translated")
        return
    tool, spec = parsed.group(1), parsed.group(2)
    reason = f"Imported from {out.source.name}: {effect} {entry}"
    if tool.startswith("mcp__"):
        if spec is not None:
            out.warn(where, "an MCP tool takes no specifier: not translated")
            return
        glob = tool if tool.count("__") >= 2 else f"{tool}__*"
        rule = make_rule(out.rule_id(effect, tool), effect, reason, glob, source=None)
        out.add(rule, lambda call: fnmatch.fnmatchcase(call["tool"], glob),
                [(agent_call(glob.replace("*", "example"), {}), True)])
    elif spec is None or spec.strip() in ("", "*", ":*"):
        _whole_tool(out, effect, tool, reason)
    elif tool == "Bash":
        _bash(out, effect, spec, reason, where)
    elif tool in PATH_TOOLS:
        _paths(out, effect, tool, spec, reason, where, base)
    elif tool == "WebFetch" and spec.startswith("domain:"):
        _domain(out, effect, spec.removeprefix("domain:").strip(), reason, where)
    else:
        out.warn(where, f"toolkeeper has no translation for {tool}'s specifier ({spec}): not translated")


def _whole_tool(out: Translation, effect: str, tool: str, reason: str) -> None:
    tools = list(dict.fromkeys(name for names, _ in PATH_TOOLS.get(tool, [([tool], "")]) for name in names))
    rule = make_rule(out.rule_id(effect, tool), effect, reason, tools)
    arguments = {"command": "echo example"} if tool == "Bash" else {}
    out.add(rule, lambda call: call["tool"] in tools, [(agent_call(tools[0], arguments), True)])


def _bash(out: Translation, effect: str, spec: str, reason: str, where: str) -> None:
    spec = spec.strip()
    single_tail = spec.endswith(" *") and spec.count("*") == 1  # `git diff *`: the trailing wildcard is optional
    prefix = spec[:-2] if spec.endswith(":*") or single_tail else None
    words = shell_words(prefix) if prefix is not None and "*" not in prefix else None
    if words:  # `npm run test:*`, `git diff *`: the command, or it followed by arguments
        if " ".join(words) != " ".join(prefix.split()):
            out.warn(where, "approximate: the prefix's quoting is read as shell words")
        test: dict[str, Any] = prefixes_test([words])
        example, matches = " ".join(words), _prefix_match(prefix)
    elif "*" not in spec:  # an exact command
        test, example, matches = {"matches": command_regex(spec, effect)}, spec, _exact_match(spec)
    else:  # wildcards anywhere: a regular expression, and the literal words before the first as a prefix
        pattern = spec[:-2] + " *" if spec.endswith(":*") else spec
        test = {"matches": command_regex(pattern, effect)}
        head = pattern.split("*")[0]
        lead = head.split() if head[-1:].isspace() else head.split()[:-1]  # a word the `*` ends is not literal
        if lead:
            test = {**prefixes_test([lead]), **test}
        out.warn(where, "approximate: a wildcard inside a command is read as a regular expression on the command "
                        "line, not on the parsed command")
        example = re.sub(r"\*$", "", pattern).replace("*", "x").strip()
        matches = _wildcard_match(pattern)
    rule = make_rule(out.rule_id(effect, "bash", spec), effect, reason, "Bash", {"command": test})

    def reads(call: Call) -> bool:  # Claude Code's reading: each command of the line against the entry
        return call["tool"] == "Bash" and each_command((call.get("arguments") or {}).get("command"), effect, matches)

    out.add(rule, reads, [(agent_call("Bash", {"command": example}), True)])


def _prefix_match(prefix: str):
    normal = " ".join(prefix.split())
    return lambda command: " ".join(command.split()) == normal or " ".join(command.split()).startswith(normal + " ")


def _exact_match(spec: str):
    return lambda command: " ".join(command.split()) == " ".join(spec.split())


def _wildcard_match(pattern: str):
    if pattern.endswith(" *") and pattern.count("*") == 1:  # `git diff *`: the command, or it and arguments
        head = pattern[:-2]
        return lambda command: command == head or command.startswith(head + " ")
    return lambda command: wildcard_fullmatch(pattern, command)


def _paths(out: Translation, effect: str, tool: str, spec: str, reason: str, where: str, base: str) -> None:
    pattern, anywhere = _absolute(spec.strip(), base)
    test, exact, full = _path_test(pattern, anywhere, base)
    if not exact:
        out.warn(where, "approximate: the glob is read as a folder (under:) and a regular expression on the path's "
                        "end, which does not pin how deep the file lies")
    example = re.sub(r"\[[^\]]*\]", "x", pattern.replace("**/", "").replace("**", "x").replace("*", "x")
                     .replace("?", "x"))
    example = posixpath.join(base, example) if anywhere else example
    for tools, argument in PATH_TOOLS[tool]:
        rule = make_rule(out.rule_id(effect, tool, spec, *([] if tools == PATH_TOOLS[tool][0][0] else tools)),
                         effect, reason, tools, {argument: test})
        out.add(rule, _path_match(tools, argument, full), [(agent_call(tools[0], {argument: example}), True)])


def _absolute(spec: str, base: str) -> tuple[str, bool]:
    """The pattern from the filesystem's root or `~`, and whether it matches at any depth (gitignore: a pattern
    with no slash but a trailing one)."""
    if spec.startswith("//"):
        return posixpath.normpath(spec[1:]), False
    if spec == "~" or spec.startswith("~/"):
        return posixpath.normpath(spec), False
    if spec.startswith("/"):
        return posixpath.normpath(posixpath.join(base, spec[1:])), False
    relative = spec.removeprefix("./")
    if relative.startswith("**/"):
        return relative[3:], True
    if "/" not in relative.rstrip("/"):
        return relative.rstrip("/"), True
    return posixpath.normpath(posixpath.join(base, relative)), False


def _path_test(pattern: str, anywhere: bool, base: str) -> tuple[dict[str, Any], bool, re.Pattern[str]]:
    """The value test, whether it is exact, and the full pattern as the source reads it (for the scenarios)."""
    if anywhere:
        return ({"under": [base], "matches": _searched(f"**/{pattern}")}, True,
                re.compile(f"{re.escape(base)}/{glob_regex(f'**/{pattern}', WHOLE)}(?:/.*)?", re.S))
    segments = pattern.split("/")
    literal = next((index for index, part in enumerate(segments) if GLOB.search(part)), len(segments))
    folder = "/".join(segments[:literal]) or "/"
    rest = segments[literal:]
    full = re.compile(glob_regex(pattern, WHOLE) + "(?:/.*)?", re.S)
    if rest in ([], ["**"]):
        return {"under": [folder]}, True, full
    anchor = f"**/{segments[literal - 1]}" if literal > 0 and segments[literal - 1] else ""
    return {"under": [folder], "matches": _searched(f"{anchor}/{'/'.join(rest)}")}, False, full


WHOLE = r"(?=/|\Z)"  # where a glob ends in a path: the path's end, or a folder's and a path inside it


def _searched(glob: str) -> str:
    """The `matches:` test of a glob: the path, from its start, is the glob or a path inside it; a line break is a
    character like any other. `**/NAMES` is searched after each `/` (`(?:^|/)\\.env(?=/|$)`), each try bounded by
    the names; with another `**` in it, from the start in one pass (`^**/a/**/b`)."""
    names = glob.removeprefix("**/")
    if names != glob and "**" not in names:
        return f"(?s)(?:^|/){glob_regex(names, '(?=/|$)')}"
    return f"(?s)^{glob_regex(glob, '(?=/|$)')}"


def _path_match(tools: list[str], argument: str, full: re.Pattern[str]):
    def matches(call: Call) -> bool:
        value = (call.get("arguments") or {}).get(argument)
        inside = isinstance(value, str) and full.fullmatch(posixpath.normpath(value)) is not None
        return call["tool"] in tools and inside

    return matches


def _domain(out: Translation, effect: str, domain: str, reason: str, where: str) -> None:
    """`domain:HOST` (`domain:*.HOST`: its subdomains). Claude Code compares HOST with `new URL(url).hostname`,
    the host as a WHATWG URL parser writes it (lower case, in ASCII); the rule's regular expression reads the URL
    as that parser does, and a deny or an ask also holds where a regular expression cannot tell the host (see
    _host_regex)."""
    sub = domain.startswith("*.")
    written = domain.removeprefix("*.")
    host = _ascii_host(written)
    if host is None:
        out.warn(where, "not a host name a URL can hold: not translated")
        return
    if effect == "allow" and host != written:
        out.warn(where, f"Claude Code compares it with the host as its URL parser writes it ({host}), which never "
                        "reads so: this allow allows nothing there, and is not translated")
        return
    regex = _host_regex(host, sub, restricts=effect != "allow")
    rule = make_rule(out.rule_id(effect, "webfetch", domain), effect, reason, "WebFetch", {"url": {"matches": regex}})

    def matches(call: Call) -> bool:
        url = (call.get("arguments") or {}).get("url")
        name = whatwg_hostname(url) if isinstance(url, str) else None
        return call["tool"] == "WebFetch" and name is not None and (name.endswith("." + host) if sub else
                                                                    name == host)

    example = f"https://{'www.' if sub else ''}{host}/"
    out.add(rule, matches, [(agent_call("WebFetch", {"url": example}), True)])


# How a WHATWG URL parser reads an http(s) URL's host: after the scheme and any run of `/` or `\`, the authority
# runs to the first `/`, `\`, `?` or `#`; the userinfo ends at its last `@`; a `:` and digits (maybe none) are the
# port. Before all that, the parser drops every tab and line break, and spaces and controls at either end.
_SCHEME = r"[\x00-\x20]*[a-z][a-z0-9+.-]*:[/\\]*"
_USERINFO = r"(?:[^/\\?#]*@)?"
_PORT = r"(?::[0-9]*)?"
_AUTHORITY_END = r"(?=[/\\?#]|[\x00-\x20]*\Z)"
_IN_HOST = r"[^/\\?#@]*"  # the host's characters, its port's too: no `@` can follow the userinfo's last
# a `%`-escape or a character beyond ASCII; matched case-sensitively, as with (?i) a range of them holds the
# Kelvin sign and the long s, which fold to k and s
_DECODED = r"(?-i:[%\x80-\U0010ffff])"


def _host_regex(host: str, sub: bool, *, restricts: bool) -> str:
    """A regular expression on a URL that holds when its host is `host` (`sub`: a subdomain of it).

    An allow holds only for a URL that names the host plainly (`http(s)://`, ASCII, no escapes). A deny or an ask
    holds for every spelling the parser reads as the host (any scheme, slashes or none, backslashes, a userinfo,
    an empty port, a trailing dot, upper case), and for what a regular expression cannot read: a tab or line
    break anywhere (the parser drops them, so a host may be written across one), a host with a `%`-escape or a
    character beyond ASCII (the parser decodes and maps them: `ex%61mple.com`, and the same in fullwidth
    letters, are example.com), and for an IP address, any host the parser would read as a number (`2130706433`
    is 127.0.0.1).
    """
    name = re.escape(host)
    if not restricts:
        labels = r"(?:[a-z0-9_-]+\.)+" if sub else ""
        return rf"(?i)^https?://{_USERINFO}{labels}{name}{_PORT}(?:[/\\?#]|\Z)"
    labels = r"(?:[^/\\?#@:]*\.)" if sub else ""
    hosts = [rf"{labels}{name}\.?{_PORT}", rf"{_IN_HOST}{_DECODED}{_IN_HOST}"]
    if _is_ip_address(host):
        hosts.append(rf"(?:\[[^\]]*\]|(?:[^/\\?#@:]*\.)?(?:0x[0-9a-f]*|[0-9]+)\.?){_PORT}")
    return rf"(?i)^(?:[^\t\n\r]*[\t\n\r]|{_SCHEME}{_USERINFO}(?:{'|'.join(hosts)}){_AUTHORITY_END})"


def _ascii_host(host: str) -> str | None:
    """A host name as a URL parser writes it: lower case, an international name in ASCII (`xn--`)."""
    separators = "/\\?#@% " if host.startswith("[") else "/\\?#@:% "  # an IPv6 address holds colons
    if not host or any(char in host for char in separators):
        return None
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        return None


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def whatwg_hostname(url: str) -> str | None:
    """The host of an http(s) URL as a WHATWG URL parser reads it (Claude Code's `new URL(url).hostname`), close
    enough for the scenarios' examples: None when it is not such a URL."""
    url = re.sub(r"[\t\n\r]", "", url.strip("".join(map(chr, range(0x21)))))
    scheme, colon, rest = url.partition(":")
    if not colon or scheme.lower() not in ("http", "https"):
        return None
    authority = re.split(r"[/\\?#]", rest.lstrip("/\\"), maxsplit=1)[0]
    host = authority.rpartition("@")[2]
    host = host if host.startswith("[") else host.partition(":")[0]
    try:
        return unquote(host).encode("idna").decode("ascii").lower()
    except UnicodeError:
        return None
