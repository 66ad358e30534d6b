"""What the command reader finds (commands.py and catalogued.py share it): each command, and the resolution
being built, which carries the reader's own functions so that catalogued.py can hand back what a program runs."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field

from toolkeeper.policy.shell import SimpleCommand

STDIN_FILES = frozenset({"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "-"})  # a script file that is the input
DESCRIPTOR_FILES = ("/dev/fd/", "/proc/self/fd/")


def special_file(path: str) -> str:
    """A path as the kernel reads it (`/dev/./stdin`, `///dev/stdin` are /dev/stdin); any other file of /dev or
    /proc a script is read from (`/dev/tty`, `/proc/1/fd/0`) is a descriptor's: /dev/fd/?, which no heredoc names."""
    if path == "-" or not path.startswith("/"):
        return path
    normal = "/" + posixpath.normpath(path).lstrip("/")
    if normal in STDIN_FILES or normal.startswith(DESCRIPTOR_FILES) or normal == "/dev/null":
        return normal
    return "/dev/fd/?" if normal.startswith(("/dev/", "/proc/")) else path


@dataclass(frozen=True)
class Command:
    argv: tuple[str | None, ...]  # as it would run: argv[0] the program as written
    writes: tuple[str | None, ...] = ()  # files its output is redirected to
    transparent: bool = False  # a wrapper whose command is listed too: allow rules look through it
    open_arguments: bool = False  # more arguments come at run time (xargs): its flags are not all known
    via: str = ""  # how it was found, for reasons: "sudo", "bash -c", "find -exec"
    moved: tuple[str | None, ...] = ()  # where `cd` went earlier in the line (None: somewhere known at run time):
    #                                     its relative paths may be from there as well as from the working directory
    reads: tuple[str | None, ...] = ()  # files redirected to its input
    read_by: str = ""  # the catalogue entry it was read by (programs.yaml), for `policy explain`

    @property
    def program(self) -> str | None:
        """The base name: `/bin/rm`, `\\rm`, `"rm"` are all rm."""
        return posixpath.basename(self.argv[0]) if self.argv and self.argv[0] is not None else None


@dataclass(frozen=True)
class Resolution:
    commands: tuple[Command, ...] = ()
    unresolved: tuple[str, ...] = ()  # why some of it cannot be known: rules fail closed


@dataclass
class Found:
    """A resolution being built, with what the line has set so far for the commands after."""

    reader: Reader  # commands.py's readers, which catalogued.py hands what a program runs
    commands: list[Command] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    moved: tuple[str | None, ...] = ()  # the `cd`s seen so far
    cdpath: bool = False  # CDPATH was set: where a `cd` goes is not known
    hashed: dict[str, str | None] = field(default_factory=dict)  # `hash -p PATH NAME`: NAME runs PATH
    input: tuple[str | None, bool] | None = None  # `exec 0<<< SCRIPT`: (the script, or None with fed) from then

    def done(self) -> Resolution:
        return Resolution(tuple(self.commands), tuple(dict.fromkeys(self.unresolved)))


@dataclass(frozen=True)
class Reader:
    """commands.py's functions that read a script, a simple command, a shell's arguments, a script file and an
    assignment, each into a Found."""

    script: Callable[[str, Found, int, str], None]
    simple: Callable[[SimpleCommand, Found, int, str], None]
    shell: Callable[[Command, SimpleCommand, Found, int], None]
    script_file: Callable[[str | None, str, SimpleCommand, Found, int], None]
    assigned: Callable[[str, str | None, Found, int], None]
