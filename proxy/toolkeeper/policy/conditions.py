"""The tests a rule puts to one value: equality, patterns, numbers, paths (`under`) and commands (`runs`).

Every test answers for a rule that restricts (deny, ask) or one that allows,
and fails closed the same way: what cannot be told (a command toolkeeper
cannot parse, a path that climbs out of an unknown working directory)
matches a deny or an ask and never an allow. Each such case is noted in the
`Scope`, so the decision's reason can say why the rule matched.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from toolkeeper.common import Strict, regex
from toolkeeper.policy import globs, outputs, paths
from toolkeeper.policy.commands import Command, Resolution, commands_of_argv, commands_of_script
from toolkeeper.policy.flags import all_of, has_flags, starts
from toolkeeper.policy.matching import searched


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
    arguments: tuple[str, ...] | None = None  # one of its arguments matches one of these globs (+*, --force*)
    writes_under: tuple[str, ...] | None = None  # it writes under one of these (a redirection, outputs.py)
    under: tuple[str, ...] | None = None  # a path it names (an argument, a redirection) is under one of these
    not_under: tuple[str, ...] | None = None  # a path it names is under none of these (`.`: the working directory)
    targets: tuple[str, ...] | None = None  # a path it names is one of these itself (or `/*` over one)
    names: tuple[str, ...] | None = None  # a path it names has a base name one of these globs may match (.env, id_*)

    @field_validator("flags")
    @classmethod
    def _short(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for flag in value or ():
            if len(flag.lstrip("-")) != 1:
                raise ValueError(f"flags are single letters (r, f); {flag!r} is not one")
        return tuple(flag.lstrip("-") for flag in value) if value else value

    @field_validator("writes_under", "under", "not_under", "targets", mode="before")
    @classmethod
    def _folders(cls, value: Any) -> Any:
        return _folders(value)

    @model_validator(mode="after")
    def _something(self) -> RunsTest:
        if not self.model_fields_set:
            raise ValueError("runs needs at least one of program, flags, prefix, arguments, writes_under, under, "
                             "not_under, targets, names")
        return self

    @property
    def prefixes(self) -> tuple[tuple[str, ...], ...]:
        if not self.prefix:
            return ()
        return tuple(self.prefix) if isinstance(self.prefix[0], tuple) else (self.prefix,)  # type: ignore[return-value]

    def verdict(self, command: Command, workdir: str | None) -> paths.Answer:
        """True, False, or None when it depends on what is known only at run time."""
        return all_of([*self._word_answers(command), *self._path_answers(command, workdir)])

    def _word_answers(self, command: Command) -> list[paths.Answer]:
        answers: list[paths.Answer] = []
        if self.program is not None:
            programs = (self.program,) if isinstance(self.program, str) else self.program
            answers.append(command.program in {p.rsplit("/", 1)[-1] for p in programs})
        if self.prefixes:
            answers.append(paths.any_of(starts(command, prefix) for prefix in self.prefixes))
        if self.flags:
            answers.append(has_flags(command, self.flags))
        if self.arguments is not None:
            answers.append(_some_argument(command, self.arguments))
        return answers

    def _path_answers(self, command: Command, workdir: str | None) -> list[paths.Answer]:
        """Each path test, over the paths the command names, each as from every folder it may be read from."""
        answers = []
        if self.writes_under is not None:
            folders = self.writes_under
            written = [*command.writes, *outputs.written_by(command)]
            answers.append(paths.of_command(command, written, workdir, lambda path: paths.under(path, folders, workdir),
                                            closed=outputs.is_writer(command)))
        named = [*paths.named_in(command), *command.writes, *command.reads]
        for test in self._path_tests(workdir):
            answers.append(paths.of_command(command, named, workdir, test))
        return answers

    def _path_tests(self, workdir: str | None) -> list[PathTest]:
        return _path_tests(workdir, self.under, self.not_under, self.names, self.targets)


PathTest = Callable[[str | None], paths.Answer]


def _path_tests(workdir: str | None, under: tuple[str, ...] | None, not_under: tuple[str, ...] | None,
                names: tuple[str, ...] | None, targets: tuple[str, ...] | None = None,
                reaches: tuple[str, ...] | None = None) -> list[PathTest]:
    """The tests of one path that a test's keys ask for, each with the working directory `.` stands for."""
    tests: list[PathTest] = []
    if under is not None:
        tests.append(lambda path: paths.under(path, under, workdir))
    if reaches is not None:
        tests.append(lambda path: paths.reaches(path, reaches, workdir))
    if not_under is not None:
        tests.append(lambda path: _negated(paths.under(path, not_under, workdir)))
    if targets is not None:
        tests.append(lambda path: paths.one_of(path, targets, workdir))
    if names is not None:
        tests.append(lambda path: paths.name_matches(path, names))
    return tests


def _negated(answer: paths.Answer) -> paths.Answer:
    return None if answer is None else not answer


def _some_argument(command: Command, patterns: tuple[str, ...]) -> paths.Answer:
    """One of the command's arguments (as bash makes them) matches one of the globs; one known only at run
    time (a variable, what xargs adds) may, and so may one that matches only with case folded (a program may
    read it so: git's config keys, `-c REMOTE.ORIGIN.PUSH=...`)."""
    answers: list[paths.Answer] = [None] if command.open_arguments else []
    for word in command.argv[1:]:
        answers.append(None if word is None else _argument_matches(word, patterns))
    return paths.any_of(answers)


def _argument_matches(word: str, patterns: tuple[str, ...]) -> paths.Answer:
    if any(fnmatch.fnmatchcase(word, glob) for glob in patterns):
        return True
    return None if any(fnmatch.fnmatchcase(word.lower(), glob.lower()) for glob in patterns) else False


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
            scope.notes.append("part of the command is known only at run time (a variable, a pattern the shell "
                               "expands, where a path lies while the working directory is not known, or a word "
                               "a program may read with case folded), so it counts as matching")
        return any(answer is not False for _, answer in answers)
    decisive = [answer for command, answer in answers if not command.transparent]
    return bool(decisive) and all(answer is True for answer in decisive)


class Alternatives(tuple):  # type: ignore[type-arg]
    """The values of the arguments `a|b` names that the call has: a test holds on one of them for a rule that
    restricts (deny, ask), on every one for an allow."""


def dotted(arguments: Any, path: str) -> tuple[bool, Any]:
    """A value by its dotted path (`input.path`): (present, value); `a|b` names either argument (a value that
    is Alternatives, when any is present); `a from b`, the paths or patterns of `a` as read from the folder `b`
    names (`pattern from path`: Glob's pattern `**/.aws/*` in its path `/root` is `/root/**/.aws/*`)."""
    if " from " in path:
        return _read_from(arguments, *(part.strip() for part in path.split(" from ", 1)))
    if "|" in path:
        found = [value for present, value in (dotted(arguments, one) for one in path.split("|")) if present]
        return bool(found), Alternatives(found) if found else None
    value = arguments
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _read_from(arguments: Any, patterns: str, folders: str) -> tuple[bool, Any]:
    """The values of `patterns`, each relative one joined after each folder of `folders` (as it is where the
    call names none: relative to the working directory)."""
    present, value = dotted(arguments, patterns)
    if not present:
        return False, None
    named, where = dotted(arguments, folders)
    places = [place for place in (where if isinstance(where, Alternatives) else [where]) if isinstance(place, str)]
    if not named or not places:
        return True, value
    values = value if isinstance(value, Alternatives) else [value]
    joined = [_joined(one, place) for one in values for place in places]
    return True, joined[0] if len(joined) == 1 else Alternatives(joined)


def _joined(value: Any, place: str) -> Any:
    """A path or pattern (or a list of them) read from the folder `place`: a relative one joined after it."""
    if isinstance(value, list):
        return [_joined(entry, place) for entry in value]
    if not isinstance(value, str) or value.startswith(("/", "~")) or not place:
        return value
    return place.rstrip("/") + "/" + value if place.rstrip("/") else "/" + value


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
    reaches: tuple[str, ...] | None = None  # a path under one of these, or a folder above one (searched whole)
    names: tuple[str, ...] | None = None  # a path (or paths) whose base name one of these globs may match
    runs: Runs | None = None  # a command line or an argv that runs a matching command

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("matches")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return regex(value)

    @field_validator("under", "not_under", "reaches", mode="before")
    @classmethod
    def _folders(cls, value: Any) -> Any:
        return _folders(value)

    @field_validator("runs", mode="before")
    @classmethod
    def _runs(cls, value: Any) -> Any:
        return _one_or_many(value)

    def holds(self, value: Any, present: bool, *, restricts: bool = False, scope: Scope | None = None) -> bool:
        scope = scope or Scope()
        if isinstance(value, Alternatives):  # `a|b`: each argument of those the call has, on its own
            found = [self.holds(one, True, restricts=restricts, scope=scope) for one in value]
            return any(found) if restricts else all(found)
        if self.present is not None and self.present != present:
            return False
        if not present:
            return self.present is False
        return self._values_hold(value, restricts, scope) and self._paths_hold(value, restricts, scope) and (
            self.runs is None or runs_hold(self.runs, value, restricts, scope))

    def _values_hold(self, value: Any, restricts: bool, scope: Scope) -> bool:
        fields = self.model_fields_set
        if "equals" in fields and value != self.equals:
            return False
        if "not_equals" in fields and value == self.not_equals:
            return False
        if self.one_of is not None and value not in self.one_of:
            return False
        if self.matches is not None and not self._found(value, restricts, scope):
            return False
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.above is not None and not (numeric and value > self.above):
            return False
        return self.below is None or (numeric and value < self.below)

    def _paths_hold(self, value: Any, restricts: bool, scope: Scope) -> bool:
        tests = _path_tests(scope.workdir, self.under, self.not_under, self.names, reaches=self.reaches)
        return all(_each_path(value, test, restricts, scope) for test in tests)

    def _found(self, value: Any, restricts: bool, scope: Scope) -> bool:
        """The pattern in a string; in a list of strings (a built-in call's commands, an argv), in any entry for a
        rule that restricts (deny, ask) and in every entry for an allow: no entry can slip past a deny. A text too
        long to search (matching.py) matches a deny or an ask, never an allow."""
        if isinstance(value, list) and value:
            found = (isinstance(entry, str) and searched(self.matches or "", entry, restricts, scope.notes)
                     for entry in value)
            return any(found) if restricts else all(found)
        return isinstance(value, str) and searched(self.matches or "", value, restricts, scope.notes)


def _each_path(value: Any, test: PathTest, restricts: bool, scope: Scope) -> bool:
    """A path, or a list of paths (any for deny and ask, all for allow), passes the test; a pattern with braces
    (`*.{pem,key}`, as the agents' file tools expand it) is each of its words. What cannot be told counts for
    deny and ask, never for allow."""
    entries = value if isinstance(value, list) else [value]
    if not entries or not all(isinstance(entry, str) for entry in entries):
        return False
    words = [word for entry in entries for word in (globs.braces(entry) or [None])]
    answers = [test(word) for word in words]
    if not restricts:
        return all(answer is True for answer in answers)
    if None in answers and True not in answers:
        scope.notes.append(_why_unknown(words, scope.workdir) + ", so it counts as matching")
    return any(answer is not False for answer in answers)


def _why_unknown(words: list[str | None], workdir: str | None) -> str:
    if any(word is None or globs.has_magic(word) for word in words):
        return "a pattern may name a file there (the files it matches decide)"
    if workdir is None and any(not word.startswith(("/", "~")) for word in words if word is not None):
        return "a relative path may lie there, and the working directory is not known"
    return ("where the path leads is known only where it runs (whose home `~` is, a folder above one, which a "
            "search reads whole, or a link such as /proc/self/root, which may lead anywhere)")


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
        scope = scope or Scope()
        if self.matches is not None and not any(searched(self.matches, entry, restricts, scope.notes)
                                                for entry in argv):
            return False
        if self.contains is not None and self.contains not in argv:
            return False
        return self.runs is None or runs_hold(self.runs, argv, restricts, scope)
