"""Is this path under that folder? With `~`, `..` and the agent's working directory resolved first.

`under: [~/.ssh, /etc]` must hold for `/etc/passwd`, `//etc/./passwd`,
`/tmp/../etc/passwd`, `~/.ssh/id_rsa`, `/home/me/.ssh/id_rsa` and, from a
home directory, `.ssh/x`. A rule's `~` is the agent's home, which toolkeeper
may not share (a central serve, an agent on a laptop): it is any home
(`/home/NAME`, `/Users/NAME`, `/root`, and toolkeeper's own). Symbolic links
are not followed (the files are the agent's, not always on this machine).

When the working directory is not known (an agent calling through the API
says nothing of it), a relative path cannot be placed: it counts as possibly
under a folder when it climbs out with `..`, or when it starts with the
folder's own last parts (`.ssh/id_rsa` for `~/.ssh`), so the answer is None
(unknown) and deny rules fail closed on it.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkeeper.policy.commands import Command

Answer = bool | None  # None: it cannot be told (a deny or ask rule counts it as a match, an allow does not)
HOMES = re.compile(r"^(/home/[^/]+|/Users/[^/]+|/root|/var/root|" + re.escape(os.path.expanduser("~")) + r")(?=/|$)")
GLOB_TAIL = re.compile(r"(/(\.?\*|\{,\.\}\*|\.\[!.\]\*|\.\?\?\*))+/*$")  # /*  /.*  /{,.}*  /.[!.]*  /.??*


def any_of(answers: Iterable[Answer]) -> Answer:
    """True when one holds, else None when one cannot be told, else False."""
    found = list(answers)
    return True if True in found else (None if None in found else False)


def folder(path: str) -> str:
    """A folder as a rule names it, normalised; absolute, or from the home (`~`, kept as the agent's)."""
    resolved = resolve(path, None)
    if not resolved.startswith(("/", "~")):
        raise ValueError(f"{path!r} is not an absolute folder (write it from / or ~)")
    return resolved


def resolve(path: str, workdir: str | None) -> str:
    """The path with `..` resolved, relative to `workdir` when it is known (else still relative). A leading `~`
    stays: it is the agent's home, whatever toolkeeper's is; `~name` is a home too (the agent's machine's users
    are not toolkeeper's); `~+` is the working directory, `~-` the one before (not known: `..`)."""
    if path.startswith(("~+/", "~-/")) or path in ("~+", "~-"):
        path = ("." if path[1] == "+" else "..") + path[2:]
    elif path.startswith("~") and not path.startswith("~/") and path != "~":
        path = "~" + path[path.index("/"):] if "/" in path else "~"
    if not path.startswith(("/", "~")) and workdir:
        path = posixpath.join(workdir, path)
    normal = posixpath.normpath(path)
    if path.startswith("~") and not normal.startswith("~"):
        normal = posixpath.normpath(os.path.expanduser(path))  # above the home: only toolkeeper's own can say
    return "/" + normal.lstrip("/") if normal.startswith("/") else normal  # normpath keeps a leading //


def _homeless(path: str) -> str:
    """An absolute path in a home as from `~` (`/home/me/.ssh` -> `~/.ssh`); any other path as it is."""
    return HOMES.sub("~", path, count=1)


def _inside(path: str, found: str, exact: bool) -> bool:
    # case folded: on macOS's file system /home/a/.SSH is ~/.ssh; elsewhere a near miss counts, which fails closed
    path, found = path.lower(), found.lower()
    return path == found or (not exact and path.startswith(found.rstrip("/") + "/"))


def _compare(resolved: str, found: str, exact: bool) -> Answer:
    """An absolute (or home) path against a folder: in it (or, `exact`, it)."""
    if found.startswith("~"):
        return _inside(resolved, found, exact) or _inside(_homeless(resolved), found, exact)
    if resolved.startswith("~"):  # the agent's home, unknown here: in a folder that is in some home, perhaps
        homed = _homeless(found)
        return None if homed != found and (_inside(resolved, homed, exact) or _inside(homed, resolved, True)) \
            else False
    return _inside(resolved, found, exact)


def _relative(resolved: str, folders: tuple[str, ...]) -> Answer:
    """A relative path, the working directory unknown."""
    if resolved == ".." or resolved.startswith("../"):
        return None  # it climbs out of a working directory toolkeeper does not know
    parts = [p for p in resolved.split("/") if p not in ("", ".")]
    for found in folders:
        tail = [p for p in found.split("/") if p and p != "~"]
        if any(parts[:size] == tail[-size:] for size in range(1, len(tail) + 1) if len(parts) >= size):
            return None
    return False


def under(path: str | None, folders: tuple[str, ...], workdir: str | None) -> Answer:
    """Whether `path` is one of `folders` (resolved by `folder`) or inside one; a pattern the shell expands
    (`~/.ss?/id_rsa`) may be: unknown, when the folder and the pattern's fixed start meet."""
    if path is None or "\x00" in path:
        return None
    if GLOB.search(path):
        return _pattern_under(path, folders, workdir)
    resolved = resolve(path, workdir)
    if not resolved.startswith(("/", "~")):
        return _relative(resolved, folders)
    answers = [_compare(resolved, found, exact=False) for found in folders]
    return any_of(answers)


GLOB = re.compile(r"[*?\[]")


def _pattern_under(path: str, folders: tuple[str, ...], workdir: str | None) -> Answer:
    start = path[:GLOB.search(path).start()].rpartition("/")[0] or ("/" if path.startswith("/") else ".")  # type: ignore[union-attr]
    fixed = resolve(start, workdir)
    if not fixed.startswith(("/", "~")):
        return None
    meets = any(_compare(fixed, found, exact=False) is not False or found.lower().startswith(fixed.lower())
                for found in folders)
    return None if meets else False


def one_of(path: str | None, folders: tuple[str, ...], workdir: str | None) -> Answer:
    """Whether `path` is one of `folders` itself, or a pattern over everything in one (`/*`, `~/.*`): what `rm
    -rf` must never be given. A relative path where the working directory is not known: `.` and `..` may be
    anything (None); another relative path is inside the project (False)."""
    if path is None or "\x00" in path:
        return None
    if path.startswith(("*", ".*", "{,.}*")):
        path = "./" + path  # `rm -rf *`: everything in the folder it runs in
    resolved = resolve(GLOB_TAIL.sub("/", path), workdir)
    if not resolved.startswith(("/", "~")):
        return None if resolved in (".", "..") or resolved.startswith("../") else False
    answers = [_compare(resolved, found, exact=True) for found in folders]
    return any_of(answers)


ELSEWHERE = "\0elsewhere"  # a `cd` to a folder known only at run time


def of_command(command: Command, named: list[str | None], workdir: str | None,
           answer: Callable[[str | None, str | None], Answer], closed: bool = True) -> Answer:
    """A path test over the paths a command names, from each folder it may run in (the working directory, and
    where a `cd` before it went); with arguments known only at run time (xargs), unknown unless it holds."""
    answers = []
    for where in folders_run_in(workdir, command.moved):
        for path in named:
            relative = path is not None and not path.startswith(("/", "~"))
            answers.append(None if where == ELSEWHERE and relative else answer(path, where))
    if command.open_arguments and closed:
        answers.append(None)
    return any_of(answers)


def folders_run_in(workdir: str | None, moved: tuple[str | None, ...]) -> list[str | None]:
    """The working directory (None: not known), and where each `cd` went from it: from an unknown one, a relative
    `cd` stays relative (`cd build`: a folder inside it); one that climbs out, or to a folder known only at run
    time, is ELSEWHERE."""
    found, current = [workdir], workdir
    for target in moved:
        current = None if target is None else resolve(target, current)
        if current is None or current == ".." or current.startswith("../"):
            return [*found, ELSEWHERE]
        found.append(current)
    return found


def named_in(command: Command) -> list[str | None]:
    """The words of a command that may name a path: its operands, the values of `--opt=value` and `key=value`
    (dd's `if=`), a value joined to a short option (`-i~/.ssh/id_rsa`), each without curl's leading `@`."""
    named: list[str | None] = []
    for word in command.argv[1:]:
        if word is None:
            named.append(None)
            continue
        if not word.startswith("-"):
            named.append(word)
        elif not word.startswith("--") and len(word) > 2:
            named.append(word[2:])
        if "=" in word:
            named.append(word.partition("=")[2])
    return [w[1:] if w is not None and w.startswith("@") else w for w in named]
