"""The tests a rule puts to one value: equality, patterns, numbers, paths (`under`) and commands (`runs`).

Every test answers for a rule that restricts (deny, ask) or one that allows,
and fails closed the same way: what cannot be told (a command toolkeeper
cannot parse, a path that climbs out of an unknown working directory)
matches a deny or an ask and never an allow. Each such case is noted in the
`Scope`, so the decision's reason can say why the rule matched.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from toolkeeper.common import Strict, regex
from toolkeeper.policy import paths
from toolkeeper.policy.commands import Command, Resolution, commands_of_argv, commands_of_script

# Long options that are a short flag by another name, per program: `rm --recursive --force` is `rm -rf`.
LONG_FLAGS: dict[str, dict[str, str]] = {
    "rm": {"recursive": "r", "force": "f", "dir": "d", "verbose": "v", "interactive": "i", "R": "r"},
    "cp": {"recursive": "r", "force": "f", "R": "r", "archive": "a"},
    "chmod": {"recursive": "R"}, "chown": {"recursive": "R"}, "chgrp": {"recursive": "R"},
    "git": {"force": "f", "hard": "hard"}, "mv": {"force": "f"}, "ln": {"force": "f", "symbolic": "s"},
}
# Every long option, for the programs that take any unambiguous start of one (GNU's getopt_long): --recur --forc.
LONG_OPTIONS: dict[str, tuple[str, ...]] = {
    "rm": ("force", "interactive", "one-file-system", "no-preserve-root", "preserve-root", "recursive", "dir",
           "verbose", "help", "version"),
}
# Options a program takes before its subcommand, skipped when a prefix is compared (`git -C x push` is git push).
GLOBAL_OPTIONS: dict[str, frozenset[str]] = {
    "git": frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path", "--config-env"}),
    "kubectl": frozenset({"-n", "--namespace", "--context", "--kubeconfig", "-s", "--server", "--cluster", "--user"}),
    "docker": frozenset({"-H", "--host", "--context", "-c", "--config", "-l", "--log-level"}),
    "npm": frozenset({"--prefix", "-w", "--workspace"}),
}


@dataclass
class Scope:
    """What a value test reads beside the value: the call's working directory and type; and what it noted."""

    workdir: str | None = None
    kind: str = "function"
    notes: list[str] = field(default_factory=list)  # why a test matched without knowing (fail closed)


class RunsTest(Strict):
    """The simple commands a command string or an argv runs; all the tests given hold for one of them."""

    program: str | tuple[str, ...] | None = None  # its base name, any of
    flags: tuple[str, ...] | None = None  # every one of these short flags, however written
    prefix: tuple[str, ...] | tuple[tuple[str, ...], ...] | None = None  # its argv starts so (any of)
    writes_under: tuple[str, ...] | None = None  # it redirects output under one of these
    under: tuple[str, ...] | None = None  # a path it names (an argument, a redirection) is under one of these
    targets: tuple[str, ...] | None = None  # a path it names is one of these itself (or `/*` over one)
    names: tuple[str, ...] | None = None  # a path it names has a base name one of these globs matches (.env, id_*)

    @field_validator("flags")
    @classmethod
    def _short(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for flag in value or ():
            if len(flag.lstrip("-")) != 1:
                raise ValueError(f"flags are single letters (r, f); {flag!r} is not one")
        return tuple(flag.lstrip("-") for flag in value) if value else value

    @field_validator("writes_under", "under", "targets", mode="before")
    @classmethod
    def _folders(cls, value: Any) -> Any:
        return _folders(value)

    @model_validator(mode="after")
    def _something(self) -> RunsTest:
        if not self.model_fields_set:
            raise ValueError("runs needs at least one of program, flags, prefix, writes_under, under, targets, names")
        return self

    @property
    def prefixes(self) -> tuple[tuple[str, ...], ...]:
        if not self.prefix:
            return ()
        return tuple(self.prefix) if isinstance(self.prefix[0], tuple) else (self.prefix,)  # type: ignore[return-value]

    def verdict(self, command: Command, workdir: str | None) -> paths.Answer:
        """True, False, or None when it depends on what is known only at run time."""
        answers = []
        if self.program is not None:
            programs = (self.program,) if isinstance(self.program, str) else self.program
            answers.append(command.program in {p.rsplit("/", 1)[-1] for p in programs})
        if self.prefixes:
            answers.append(paths.any_of(_starts(command, prefix) for prefix in self.prefixes))
        if self.flags:
            answers.append(_has_flags(command, self.flags))
        if self.writes_under is not None:
            answers.append(paths.of_command(command, command.writes, workdir, lambda path, where: paths.under(
                path, self.writes_under or (), where), closed=False))
        named = [*paths.named_in(command), *command.writes, *command.reads]
        if self.under is not None:
            answers.append(paths.of_command(command, named, workdir, lambda path, where: paths.under(
                path, self.under or (), where)))
        if self.targets is not None:
            answers.append(paths.of_command(command, named, workdir, lambda path, where: paths.one_of(
                path, self.targets or (), where)))
        if self.names is not None:
            answers.append(paths.of_command(command, named, workdir, lambda path, _: None if path is None else any(
                fnmatch.fnmatchcase(posixpath.basename(path.rstrip("/")), glob) for glob in self.names or ())))
        return _all(answers)


def _resolution(value: Any, kind: str) -> Resolution | None:
    """A string is a command line; a list of strings is an argv, except a `shell` action's `commands`, each a
    command line. Anything else is not a command."""
    if isinstance(value, str):
        return commands_of_script(value)
    if isinstance(value, list) and all(isinstance(entry, str) for entry in value):
        if kind == "shell_call":
            lines = [commands_of_script(line) for line in value]
            return Resolution(tuple(c for line in lines for c in line.commands),
                              tuple(u for line in lines for u in line.unresolved))
        return commands_of_argv(tuple(value))
    if isinstance(value, list):
        return Resolution(unresolved=("an argv with entries that are not strings",))
    return None


def _folders(value: Any) -> Any:
    """Folders as a rule names them, resolved once at load (`~` expanded, `..` gone, absolute)."""
    if not isinstance(value, list | tuple):
        return value
    if any(entry is None for entry in value):
        raise ValueError('an entry is empty: YAML reads a bare ~ as nothing, so write the home folder "~"')
    return tuple(paths.folder(entry) if isinstance(entry, str) else entry for entry in value)


Runs = tuple[RunsTest, ...]  # one test, or a list: a command matches when any of them holds


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, dict) else value


def runs_hold(tests: Runs, value: Any, restricts: bool, scope: Scope) -> bool:
    """Deny and ask: some command matches, or the value cannot be read. Allow: every command does (the
    transparent wrappers, env or bash -c, looked through)."""
    resolution = _resolution(value, scope.kind)
    if resolution is None:
        return False  # not a command at all (a number, an object): nothing to match
    if resolution.unresolved:
        if restricts:
            scope.notes.append("toolkeeper could not resolve the command (" + "; ".join(
                dict.fromkeys(resolution.unresolved)) + "), so it counts as matching")
        return restricts
    answers = [(command, paths.any_of(test.verdict(command, scope.workdir) for test in tests))
               for command in resolution.commands]
    if restricts:
        if any(answer is None for _, answer in answers) and not any(answer for _, answer in answers):
            scope.notes.append("part of the command is known only at run time (a variable, or a relative path "
                               "where the working directory is not known), so it counts as matching")
        return any(answer is not False for _, answer in answers)
    decisive = [answer for command, answer in answers if not command.transparent]
    return bool(decisive) and all(answer is True for answer in decisive)


def dotted(arguments: Any, path: str) -> tuple[bool, Any]:
    """A value by its dotted path (`input.path`): (present, value)."""
    value = arguments
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


COMMAND_ARGUMENTS = ("command", "cmd", "action.commands", "action.command")  # the agents' shell tools' (explain)


def commands_in(document: dict[str, Any]) -> list[tuple[str, Resolution]]:
    """The commands in a call's usual command arguments and its argv, as `runs:` reads them (for `explain`)."""
    found = []
    arguments = document.get("arguments") if isinstance(document.get("arguments"), dict) else {}
    kind = document["tool"].get("kind", "function")
    for name in COMMAND_ARGUMENTS:
        _, value = dotted(arguments, name)
        try:
            resolution = _resolution(value, kind) if value is not None else None
        except Exception as exc:  # what the rules fail closed on, explain says
            resolution = Resolution(unresolved=(f"the command cannot be read ({exc})",))
        if resolution is not None:
            found.append((name, resolution))
    if document.get("argv"):
        found.append(("argv", commands_of_argv(tuple(document["argv"]))))
    return found


def _all(answers: list[paths.Answer]) -> paths.Answer:
    return False if any(a is False for a in answers) else (None if any(a is None for a in answers) else True)


def _starts(command: Command, prefix: tuple[str, ...]) -> paths.Answer:
    if not command.argv or command.program != prefix[0].rsplit("/", 1)[-1]:
        return False
    direct = _words_start(command.argv[1:], prefix[1:])
    if direct is not False or command.program not in GLOBAL_OPTIONS:
        return direct
    return _words_start(_after_global_options(command.argv[1:], GLOBAL_OPTIONS[command.program]), prefix[1:])


def _words_start(words: tuple[str | None, ...] | list[str | None], prefix: tuple[str, ...]) -> paths.Answer:
    if len(words) < len(prefix):
        return False
    return _all([None if word is None else word == wanted for word, wanted in zip(words, prefix, strict=False)])


def _after_global_options(words: tuple[str | None, ...], valued: frozenset[str]) -> list[str | None]:
    rest = list(words)
    while rest and rest[0] is not None and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in valued and rest:
            rest.pop(0)
    return rest


def _has_flags(command: Command, wanted: tuple[str, ...]) -> paths.Answer:
    """Every wanted short flag among the arguments before `--` (GNU tools read options after operands too)."""
    aliases = LONG_FLAGS.get(command.program or "", {})
    found: set[str] = set()
    unknown = command.open_arguments
    for word in command.argv[1:]:
        if word is None:
            unknown = True
        elif word == "--":
            break
        elif word.startswith("--"):
            found.add(aliases.get(_long_option(command.program or "", word[2:].split("=")[0]), ""))
        elif word.startswith("-") and len(word) > 1:
            found.update(aliases.get(letter, letter) for letter in word[1:])
    if all(flag in found for flag in wanted):
        return True
    return None if unknown else False


def _long_option(program: str, given: str) -> str:
    """The long option `--given` names: itself, or the one option it is the start of (GNU tools take those)."""
    known = LONG_OPTIONS.get(program, ())
    if given in known or not known:
        return given
    starting = [option for option in known if option.startswith(given)]
    return starting[0] if len(starting) == 1 else given


class ValueTest(Strict):
    """Tests on one value; all given must hold."""

    equals: Any = None
    not_equals: Any = None
    one_of: tuple[Any, ...] | None = Field(default=None, alias="in")
    matches: str | None = None  # searched, as in JSON Schema: anchor with ^...$
    above: float | None = None
    below: float | None = None
    present: bool | None = None
    under: tuple[str, ...] | None = None  # a path (or paths) under one of these folders
    not_under: tuple[str, ...] | None = None  # a path (or paths) under none of these folders
    runs: Runs | None = None  # a command line or an argv that runs a matching command

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("matches")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return regex(value)

    @field_validator("under", "not_under", mode="before")
    @classmethod
    def _folders(cls, value: Any) -> Any:
        return _folders(value)

    @field_validator("runs", mode="before")
    @classmethod
    def _runs(cls, value: Any) -> Any:
        return _one_or_many(value)

    def holds(self, value: Any, present: bool, *, restricts: bool = False, scope: Scope | None = None) -> bool:
        scope = scope or Scope()
        if self.present is not None and self.present != present:
            return False
        if not present:
            return self.present is False
        fields = self.model_fields_set
        if "equals" in fields and value != self.equals:
            return False
        if "not_equals" in fields and value == self.not_equals:
            return False
        if self.one_of is not None and value not in self.one_of:
            return False
        if self.matches is not None and not self._found(value, restricts):
            return False
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.above is not None and not (numeric and value > self.above):
            return False
        if self.below is not None and not (numeric and value < self.below):
            return False
        if self.under is not None and not self._under(value, self.under, restricts, scope):
            return False
        if self.not_under is not None and not self._under(value, self.not_under, restricts, scope, negate=True):
            return False
        return self.runs is None or runs_hold(self.runs, value, restricts, scope)

    def _found(self, value: Any, restricts: bool) -> bool:
        """The pattern in a string; in a list of strings (a built-in call's commands, an argv), in any entry for a
        rule that restricts (deny, ask) and in every entry for an allow: no entry can slip past a deny."""
        if isinstance(value, list) and value:
            found = (isinstance(entry, str) and re.search(self.matches or "", entry) for entry in value)
            return any(found) if restricts else all(found)
        return isinstance(value, str) and re.search(self.matches or "", value) is not None

    @staticmethod
    def _under(value: Any, folders: tuple[str, ...], restricts: bool, scope: Scope, negate: bool = False) -> bool:
        """A path, or a list of paths (any for deny and ask, all for allow), under the folders (or, `negate`, under
        none of them); what cannot be told counts for deny and ask, never for allow."""
        entries = value if isinstance(value, list) else [value]
        if not entries or not all(isinstance(entry, str) for entry in entries):
            return False
        answers = [paths.under(entry, folders, scope.workdir) for entry in entries]
        if negate:
            answers = [None if answer is None else not answer for answer in answers]
        if restricts:
            if None in answers and True not in answers:
                scope.notes.append("a relative path may lie there, and the working directory is not known, so it "
                                   "counts as matching")
            return any(answer is not False for answer in answers)
        return all(answer is True for answer in answers)


class ArgvTest(Strict):
    matches: str | None = None  # some argv entry matches (searched)
    contains: str | None = None  # some argv entry equals this
    runs: Runs | None = None  # the argv runs a matching command (through `bash -c`, `env`, `sudo`...)

    @field_validator("matches")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return regex(value)

    @field_validator("runs", mode="before")
    @classmethod
    def _runs(cls, value: Any) -> Any:
        return _one_or_many(value)

    def holds(self, argv: list[str], *, restricts: bool = False, scope: Scope | None = None) -> bool:
        if self.matches is not None and not any(re.search(self.matches, entry) for entry in argv):
            return False
        if self.contains is not None and self.contains not in argv:
            return False
        return self.runs is None or runs_hold(self.runs, argv, restricts, scope or Scope())
