"""Rule files, read: one file and the files it includes, so a team adds toolkeeper's shipped rules to its own.

    include: [toolkeeper:flows.yaml, ../shared/credentials.yaml]
    rules:
      - ...

An included file's rules come before the including file's own (first in the
file among equals: the team's rules follow the ones they build on). A path
is relative to the including file; `toolkeeper:NAME` is a file toolkeeper
ships (policies/ in a checkout, toolkeeper/_policies/ in a wheel), wherever
it is installed. A file included twice (two files that both include a third)
counts once; one that includes itself, through any chain, is an error, and so
is a rule id used in two files. Every error names the file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from toolkeeper.common import load_yaml_model, sha256_hex, shipped_file
from toolkeeper.policy.rules import Rules, RulesError, RulesFile

SHIPPED = "toolkeeper:"


def default_rules_path() -> Path:
    """The shipped default policy: policies/ in a checkout, toolkeeper/_policies/ in a wheel."""
    path = shipped_file("policies/default.yaml", "_policies/default.yaml")
    if path is None:
        raise RulesError("the default policy (policies/default.yaml) is not installed")
    return path


def load_rules(path: str | Path) -> Rules:
    """A rules file and all it includes, validated; its revision covers every file read."""
    path = Path(path).resolve()
    read: dict[Path, bytes] = {}
    files = _read(path, (), read)
    texts = list(read.values())
    # one file keeps the revision it always had: the hash of its text
    digest = sha256_hex(texts[0]) if len(texts) == 1 else hashlib.sha256(
        b"".join(hashlib.sha256(text).digest() for text in texts)).hexdigest()
    return Rules(path, _merged(files), digest[:12])


def _merged(files: list[tuple[Path, RulesFile]]) -> RulesFile:
    """The files' rules, limits and channels in one (each id, each channel's name, from one file only); every
    file's `notify:` adds to the default channels. A `notify:` naming no channel is an error naming its file."""
    origin: dict[tuple[str, str], Path] = {}
    for file, parsed in files:
        named = [("rule", rule.id) for rule in parsed.rules] + [("limit", limit.id) for limit in parsed.limits] + [
            ("channel", name) for name in parsed.channels]
        for what, name in named:
            if (what, name) in origin:
                key = "name" if what == "channel" else "id"
                raise RulesError(f"{file}: {what} {name!r}: the {key} is also used in {origin[what, name]}, which it "
                                 f"includes or is included beside: {what} {key}s are unique across included files")
            origin[what, name] = file
    channels = {name: channel for _, parsed in files for name, channel in parsed.channels.items()}
    merged = RulesFile.model_construct(
        rules=tuple(rule for _, parsed in files for rule in parsed.rules),
        limits=tuple(limit for _, parsed in files for limit in parsed.limits), channels=channels,
        notify=tuple(dict.fromkeys(name for _, parsed in files for name in parsed.notify)))
    _read_limits_known(files, {limit.id for limit in merged.limits}, {rule.id for rule in merged.rules})
    for file, parsed in files:
        asked = [("notify", name) for name in parsed.notify] + [
            (f"{kind} {one.id!r}", name) for kind, ones in (("rule", parsed.rules), ("limit", parsed.limits))
            for one in ones for name in one.notify or ()]
        for where, name in asked:
            if name not in channels:
                raise RulesError(f"{file}: {where}: notify names channel {name!r}, which no file declares "
                                 f"(channels: {', '.join(sorted(channels)) or 'none'})")
    return merged


def _read_limits_known(files: list[tuple[Path, RulesFile]], limits: set[str], rules: set[str]) -> None:
    """A rule that reads `limits.<id>` names a limit of the policy (a typo would never hold, silently), and no
    limit shares a rule's id (the trail names either by it)."""
    for file, parsed in files:
        for rule in parsed.rules:
            for name in rule.when.limits:
                wanted = name.split(".", 1)[0]
                if wanted not in limits:
                    raise RulesError(f"{file}: rule {rule.id!r}: when.limits tests {name!r}, and the policy has no "
                                     f"limit {wanted!r} (its limits: {', '.join(sorted(limits)) or 'none'})")
        for limit in parsed.limits:
            if limit.id in rules:
                raise RulesError(f"{file}: limit {limit.id!r}: a rule has this id too: the trail names either by it")


def _read(path: Path, chain: tuple[Path, ...], read: dict[Path, bytes]) -> list[tuple[Path, RulesFile]]:
    """`path` and the files it includes, these first, each parsed once."""
    parsed, text, _ = load_yaml_model(path, RulesFile, RulesError, what="the rules file",
                                      entries="rules", entry="rule", name_key="id")
    read[path] = text
    files: list[tuple[Path, RulesFile]] = []
    for name in parsed.include:
        included = _included(path, name)
        if included == path or included in chain:
            loop = " -> ".join(str(one) for one in (*chain, path, included)[(*chain, path).index(included):])
            raise RulesError(f"{path}: include {name!r}: the files include each other ({loop})")
        if included not in read:
            files += _read(included, (*chain, path), read)
    return [*files, (path, parsed)]


def _included(path: Path, name: str) -> Path:
    if name.startswith(SHIPPED):
        shipped = name[len(SHIPPED):]
        found = shipped_file(f"policies/{shipped}", f"_policies/{shipped}") if shipped and "/" not in shipped \
            else None
        if found is None:
            raise RulesError(f"{path}: include {name!r}: toolkeeper ships no rules file {shipped!r} "
                             "(it ships default.yaml, coding-agents.yaml, flows.yaml)")
        return found.resolve()
    included = (path.parent / name).resolve()
    if not included.is_file():
        raise RulesError(f"{path}: include {name!r}: no such file ({included})")
    return included


def rules_in_force(policy: str | None, opa_url: str | None = None) -> Rules | None:
    """The YAML rules that decide, as `serve` and `policy explain` read `--policy`: the shipped default unless
    it names a file; none for `none`, and none beside OPA unless one is named."""
    if policy == "none" or (opa_url and not policy):
        return None
    return load_rules(policy or default_rules_path())
