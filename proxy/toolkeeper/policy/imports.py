"""Another agent's permission config as toolkeeper rules, scenarios to test them, and what could not be said.

    toolkeeper policy import claude-code .claude/settings.json -o rules.yaml --scenarios rules_scenarios.yaml

Three formats: Claude Code's `permissions` (imports_claude), Codex CLI's
execpolicy rules (imports_codex), Gemini CLI's policy TOML (imports_gemini).
Each is a pure function from the file's text to an `ImportResult`: the rules,
one scenario per example, and a warning for every entry not translated
exactly (approximate, or not translated at all). Nothing is dropped unsaid.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from toolkeeper.policy.imports_base import ImportResult, PolicyImportError
from toolkeeper.policy.imports_claude import import_claude_code
from toolkeeper.policy.imports_codex import import_codex
from toolkeeper.policy.imports_gemini import import_gemini_cli

IMPORTERS: dict[str, Callable[..., ImportResult]] = {
    "claude-code": import_claude_code,
    "codex": import_codex,
    "gemini-cli": import_gemini_cli,
}
IMPORT_FORMATS = tuple(IMPORTERS)
MAX_INPUT_BYTES = 1 << 20  # a permission config is a few kilobytes
# the agent file the scenarios load: the imported rules name only the agent's own tools, so it declares none
IMPORT_AGENT_FILE = ("# The agent file of imported rules' scenarios: the rules name only the agent's own tools\n"
                     "# (source: agent), so it declares none.\ntools: []\n")

__all__ = ["IMPORT_AGENT_FILE", "IMPORT_FORMATS", "ImportResult", "PolicyImportError", "import_policy",
           "render_rules", "render_scenarios"]


def import_policy(kind: str, path: str | Path, *, project_dir: str | Path | None = None) -> ImportResult:
    """Read one file of another agent's permission config (`kind`: claude-code, codex, gemini-cli) and translate
    it; `project_dir` is Claude Code's project folder, where its `/path` and `./path` rules point. Whatever the
    file holds, it is translated or refused with a PolicyImportError, never anything else."""
    path = Path(path)
    if kind not in IMPORTERS:
        raise PolicyImportError(f"unknown format {kind!r} (known: {', '.join(IMPORT_FORMATS)})")
    text = _read(path)
    try:
        if kind == "claude-code":
            return import_claude_code(text, path, Path(project_dir).resolve() if project_dir else None)
        return IMPORTERS[kind](text, path)
    except (RecursionError, MemoryError):
        # Python's parsers (ast, json, tomllib) recurse into what the file nests, and give up on a chain or a
        # nesting deeper than their stack: a config nests a few levels, so such a file is refused, said.
        raise PolicyImportError(f"{path}: nested too deeply to be read (a permission config nests a few levels: "
                                "this is not one)") from None


def _read(path: Path) -> str:
    """The file's text, refused past MAX_INPUT_BYTES: what is read is bounded before any parser sees it."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise PolicyImportError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise PolicyImportError(f"{path}: larger than {MAX_INPUT_BYTES // 1024} KiB, more than any permission "
                                "config holds: not read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyImportError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def render_rules(result: ImportResult, *, kind: str, source: str | Path, shadow: bool = False) -> str:
    """The rules file: a header saying where the rules come from and every warning, then the rules."""
    header = [f"# Imported by `toolkeeper policy import {kind}` from {source}."]
    if shadow:
        header.append("# mode: shadow: every rule is evaluated and recorded, and decides nothing, until it is removed.")
    if result.warnings:
        header.append(f"# Not translated exactly ({len(result.warnings)}): review these before the rules ship.")
        header += [f"# WARN {warning}" for warning in result.warnings]
    rules = [{**rule, "mode": "shadow"} if shadow else rule for rule in result.rules]
    return "\n".join(header) + "\n" + _dump({"rules": rules})


def render_scenarios(result: ImportResult, *, scenarios_path: str | Path, rules_path: str | Path,
                     agent_file: str | Path, shadow: bool = False) -> str:
    """The scenario file `toolkeeper policy test` runs, its paths relative to its own folder. Rules in shadow
    mode decide nothing: each scenario then expects the call allowed, and the rules that match it in `shadow`."""
    folder = Path(scenarios_path).resolve().parent
    header = ["# Scenarios of imported rules: toolkeeper policy test " + Path(scenarios_path).name,
              "# Each expects what the original config decides for the call (the most restrictive entry that",
              "# matches it wins; none: allowed, as an agent's own tool is)."]
    if shadow:
        header.append("# The rules are in shadow mode: they decide nothing, so each call is allowed, and each")
        header.append("# scenario names the rules that match it (`shadow`).")
        scenarios = [{**{k: v for k, v in scenario.items() if k != "rule"}, "expect": "allow"}
                     for scenario in result.scenarios]
    else:
        scenarios = [{k: v for k, v in scenario.items() if k != "shadow"} for scenario in result.scenarios]
    body = {"agent_file": _relative(agent_file, folder), "policy": _relative(rules_path, folder),
            "scenarios": scenarios}
    return "\n".join(header) + "\n" + _dump(body)


def _relative(path: str | Path, folder: Path) -> str:
    return os.path.relpath(Path(path).resolve(), folder)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # a test two rules share is written out in each: no &id001 for a reader to chase


def _dump(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=None, allow_unicode=True,
                     width=10_000)
