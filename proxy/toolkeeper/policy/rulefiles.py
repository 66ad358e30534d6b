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
from toolkeeper.policy.rules import Rule, Rules, RulesError, RulesFile

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
    rules = _read(path, (), read)
    origin: dict[str, Path] = {}
    for file, rule in rules:
        if rule.id in origin and origin[rule.id] != file:
            raise RulesError(f"{file}: rule {rule.id!r}: the id is also used in {origin[rule.id]}, which it "
                             "includes or is included beside: rule ids are unique across included files")
        origin.setdefault(rule.id, file)
    texts = list(read.values())
    # one file keeps the revision it always had: the hash of its text
    digest = sha256_hex(texts[0]) if len(texts) == 1 else hashlib.sha256(
        b"".join(hashlib.sha256(text).digest() for text in texts)).hexdigest()
    return Rules(path, RulesFile.model_construct(rules=tuple(rule for _, rule in rules)), digest[:12])


def _read(path: Path, chain: tuple[Path, ...], read: dict[Path, bytes]) -> list[tuple[Path, Rule]]:
    """The rules of `path` after those of the files it includes, each with the file it is in."""
    parsed, text, _ = load_yaml_model(path, RulesFile, RulesError, what="the rules file",
                                      entries="rules", entry="rule", name_key="id")
    read[path] = text
    rules: list[tuple[Path, Rule]] = []
    for name in parsed.include:
        included = _included(path, name)
        if included == path or included in chain:
            loop = " -> ".join(str(one) for one in (*chain, path, included)[(*chain, path).index(included):])
            raise RulesError(f"{path}: include {name!r}: the files include each other ({loop})")
        if included not in read:
            rules += _read(included, (*chain, path), read)
    return rules + [(path, rule) for rule in parsed.rules]


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
