"""A command's words as a rule compares them: its argv's start (`prefix`, skipping a program's global options:
`git -C x push` is git push) and its short flags however written (`rm --recursive --force` is `rm -rf`)."""

from __future__ import annotations

from toolkeeper.policy import globs, paths
from toolkeeper.policy.commands import Command

# Long options that are a short flag by another name, per program: `rm --recursive --force` is `rm -rf`.
LONG_FLAGS: dict[str, dict[str, str]] = {
    "rm": {"recursive": "r", "force": "f", "dir": "d", "verbose": "v", "interactive": "i", "R": "r"},
    "cp": {"recursive": "r", "force": "f", "R": "r", "archive": "a"},
    "chmod": {"recursive": "R"}, "chown": {"recursive": "R"}, "chgrp": {"recursive": "R"},
    "git": {"force": "f", "hard": "hard", "delete": "d"}, "mv": {"force": "f"}, "ln": {"force": "f", "symbolic": "s"},
    "sed": {"in-place": "i"},
    "tar": {"extract": "x", "get": "x", "create": "c", "append": "r", "update": "u", "absolute-names": "P"},
    "curl": {"remote-name": "O", "remote-name-all": "O"}, "cpio": {"extract": "i", "create": "o", "pass-through": "p"},
    **{name: {"stdout": "c", "to-stdout": "c", "test": "t", "list": "l"} for name in ("gzip", "gunzip", "bzip2", "xz",
                                                                                    "zstd")},
}
BUNDLED_FIRST = frozenset({"tar"})  # its first word may be its flags without a dash: `tar xzf x.tgz`
# Every long option, for the programs that take any unambiguous start of one (GNU's getopt_long): --recur --forc.
LONG_OPTIONS: dict[str, tuple[str, ...]] = {
    "rm": ("force", "interactive", "one-file-system", "no-preserve-root", "preserve-root", "recursive", "dir",
           "verbose", "help", "version"),
    "sed": ("in-place", "expression", "file", "quiet", "silent", "regexp-extended", "separate", "null-data",
            "line-length", "posix", "sandbox", "debug", "follow-symlinks", "unbuffered", "zero-terminated", "help",
            "version"),
}
# Options a program takes before its subcommand, skipped when a prefix is compared (`git -C x push` is git push).
GLOBAL_OPTIONS: dict[str, frozenset[str]] = {
    "git": frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path", "--config-env"}),
    "kubectl": frozenset({"-n", "--namespace", "--context", "--kubeconfig", "-s", "--server", "--cluster", "--user"}),
    "docker": frozenset({"-H", "--host", "--context", "-c", "--config", "-l", "--log-level"}),
    "npm": frozenset({"--prefix", "-w", "--workspace"}),
}



def all_of(answers: list[paths.Answer]) -> paths.Answer:
    return False if any(a is False for a in answers) else (None if any(a is None for a in answers) else True)


def starts(command: Command, prefix: tuple[str, ...]) -> paths.Answer:
    if not command.argv or command.program != prefix[0].rsplit("/", 1)[-1]:
        return False
    direct = _words_start(command.argv[1:], prefix[1:])
    if direct is not False or command.program not in GLOBAL_OPTIONS:
        return direct
    return _words_start(_after_global_options(command.argv[1:], GLOBAL_OPTIONS[command.program]), prefix[1:])


def _words_start(words: tuple[str | None, ...] | list[str | None], prefix: tuple[str, ...]) -> paths.Answer:
    if len(words) < len(prefix):
        return False
    return all_of([None if word is None else word == wanted for word, wanted in zip(words, prefix, strict=False)])


def _after_global_options(words: tuple[str | None, ...], valued: frozenset[str]) -> list[str | None]:
    rest = list(words)
    while rest and rest[0] is not None and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in valued and rest:
            rest.pop(0)
    return rest


def has_flags(command: Command, wanted: tuple[str, ...]) -> paths.Answer:
    """Every wanted short flag among the arguments before `--` (GNU tools read options after operands too)."""
    aliases = LONG_FLAGS.get(command.program or "", {})
    found: set[str] = set()
    unknown = command.open_arguments
    words = command.argv[1:]
    if command.program in BUNDLED_FIRST and words and words[0] and not words[0].startswith("-"):
        words = ("-" + words[0], *words[1:])
    for word in words:
        if word is None or _may_expand(word):
            unknown = True  # known at run time: a pattern the shell expands (`rm -* x`, once `-rf` is a file)
        elif word == "--":
            break
        elif word.startswith("--"):
            found.add(aliases.get(_long_option(command.program or "", word[2:].split("=")[0]), ""))
        elif word.startswith("-") and len(word) > 1:
            found.update(aliases.get(letter, letter) for letter in word[1:])
    if all(flag in found for flag in wanted):
        return True
    return None if unknown else False


def _may_expand(word: str) -> bool:
    """An option word with a wildcard in its name: the shell may make it other options (`-*` is `-rf`)."""
    return word.startswith("-") and globs.has_magic(word.partition("=")[0] if word.startswith("--") else word)


def _long_option(program: str, given: str) -> str:
    """The long option `--given` names: itself, or the one option it is the start of (GNU tools take those)."""
    known = LONG_OPTIONS.get(program, ())
    if given in known or not known:
        return given
    starting = [option for option in known if option.startswith(given)]
    return starting[0] if len(starting) == 1 else given
