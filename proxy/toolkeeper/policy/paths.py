"""Is this path under that folder? With `~`, `..` and the agent's working directory resolved first.

`under: [~/.ssh, /etc]` must hold for `/etc/passwd`, `//etc/./passwd`,
`/tmp/../etc/passwd`, `~/.ssh/id_rsa`, `/home/me/.ssh/id_rsa` and, from a
home directory, `.ssh/x`. A rule's `~` is the agent's home, which toolkeeper
may not share (a central serve, an agent on a laptop): it is any home
(`/home/NAME`, `/Users/NAME`, `/root`, and toolkeeper's own). A rule's `.` is
the agent's working directory. Symbolic links are not followed (the files are
the agent's, not always on this machine).

A pattern the shell (or a file tool) expands may be under a folder when some
path it matches is: `/home/*/.aws/credentials` may be under `~/.aws`, and
`cat ~/.ss?/id_rsa` under `~/.ssh` (globs.py compares the two, part by part).
The answer is then None (unknown): it depends on the files there.

When the working directory is not known (an agent calling through the API
says nothing of it), a relative path cannot be placed: it counts as possibly
under a folder when it climbs out with `..`, or when it starts with the
folder's own last parts (`.ssh/id_rsa` for `~/.ssh`), so the answer is None
(unknown) and deny rules fail closed on it; any other is taken as inside the
project.

A path through a link the kernel follows to a folder anywhere (a process's root or working directory,
`/proc/self/root/...`, `/proc/1/cwd/../x`, or an open descriptor, `/proc/self/fd/3/...`, `/dev/fd/3`) may be
any path: its answer is None for every test, and a `..` after the link is kept (the kernel follows the link
first). The standard streams themselves (`/dev/fd/2`, `/proc/self/fd/1`) are files like any other.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable
from itertools import product
from typing import TYPE_CHECKING

from toolkeeper.policy import globs

if TYPE_CHECKING:
    from toolkeeper.policy.commands import Command

Answer = bool | None  # None: it cannot be told (a deny or ask rule counts it as a match, an allow does not)
OWN_HOME = os.path.expanduser("~")
HOMES = re.compile(r"^(/home/[^/]+|/Users/[^/]+|/root|/var/root|" + re.escape(OWN_HOME) + r")(?=/|$)")
HOME_PATTERNS = ("/home/*", "/Users/*", "/root", "/var/root", OWN_HOME)  # what a `~` may be, as patterns
GLOB_TAIL = re.compile(r"(/(\.?\*|\{,\.\}\*|\.\[!.\]\*|\.\?\?\*))+/*$")  # /*  /.*  /{,.}*  /.[!.]*  /.??*
WORKDIR = "."  # in a rule's folders: the agent's working directory
# Links to a folder anywhere, as parts (`*`: any one): a process's root and working directory, its descriptors
LINKS = tuple(tuple(link.split("/")) for link in (
    "proc/*/root", "proc/*/cwd", "proc/*/fd/*", "proc/*/map_files/*", "proc/*/task/*/root", "proc/*/task/*/cwd",
    "proc/*/task/*/fd/*", "dev/fd/*", "dev/stdin", "dev/stdout", "dev/stderr"))
STREAMS = frozenset({"0", "1", "2", "stdin", "stdout", "stderr"})  # a link that ends so is a stream: a file


def any_of(answers: Iterable[Answer]) -> Answer:
    """True when one holds, else None when one cannot be told, else False."""
    found = list(answers)
    return True if True in found else (None if None in found else False)


def folder(path: str) -> str:
    """A folder as a rule names it, normalised; absolute, or from the home (`~`, kept as the agent's), or `.`,
    the agent's working directory."""
    resolved = resolve(path, None)
    if not resolved.startswith(("/", "~")) and resolved != WORKDIR:
        raise ValueError(f"{path!r} is not an absolute folder (write it from / or ~, or . for the working "
                         "directory)")
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
    normal = _normal(path)
    if path.startswith("~") and not normal.startswith("~"):
        normal = _normal(os.path.expanduser(path))  # above the home: only toolkeeper's own can say
    return normal


def _normal(path: str) -> str:
    """`posixpath.normpath`, one leading slash, except that a `..` after a link to a folder anywhere is kept."""
    if not path.startswith("/"):
        return posixpath.normpath(path)
    given = [part for part in path.split("/") if part not in ("", ".")]
    parts: list[str] = []
    for index, part in enumerate(given):
        if part != "..":
            parts.append(part)
        elif parts:
            parts.pop()
        if _is_link(parts):
            parts += given[index + 1:]
            break
    return "/" + "/".join(parts)


def _is_link(parts: list[str]) -> bool:
    """Whether the path these parts make (or some path the pattern they make matches) may be such a link."""
    return _may_be_proc(parts) and any(_parts_meet(parts, list(link), exact=True) for link in LINKS)


def _may_be_proc(parts: list[str]) -> bool:
    return bool(parts) and (parts[0].lower() in ("proc", "dev") or globs.has_magic(parts[0]))


def through_link(path: str) -> bool:
    """Whether the resolved path may lead through a link to a folder anywhere, so that it may be any path. A
    standard stream itself (`/dev/fd/2`, `/dev/stdin`) is a file; a path below one is not."""
    parts = _parts(path)
    if not path.startswith("/") or not _may_be_proc(parts):
        return False
    if parts[-1].lower() in STREAMS and not globs.has_magic(path) and _is_link(parts):
        return False
    return any(_parts_meet(parts, list(link), exact=False) for link in LINKS)


def _placed(path: str) -> bool:
    return path.startswith(("/", "~"))


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


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _parts_meet(pattern: list[str], folder: list[str], exact: bool) -> bool:
    """Whether a path the parts of `pattern` match may be `folder` or (unless `exact`) inside it; `**` stands
    for any number of parts."""
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        i, j = todo.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if j == len(folder) and (not exact or all(part == "**" for part in pattern[i:])):
            return True
        if i == len(pattern) or j == len(folder):
            continue
        if pattern[i] == "**":
            todo += [(i + 1, j), (i, j + 1)]
        elif globs.overlap(pattern[i], folder[j]):
            todo.append((i + 1, j + 1))
    return False


def _spelled(path: str) -> list[str]:
    """A placed path as absolute paths (patterns): a `~` is any home."""
    return [home + path[1:] for home in HOME_PATTERNS] if path.startswith("~") else [path]


def _pattern_meets(resolved: str, found: str, exact: bool) -> bool:
    """Whether the placed pattern `resolved` may match the folder `found` or (unless `exact`) a path inside it."""
    if resolved.startswith("~") and found.startswith("~"):
        pairs = [(resolved, found)]  # the same home
    else:
        pairs = list(product(_spelled(resolved), _spelled(found)))
    return any(_parts_meet(_parts(path), _parts(place), exact) for path, place in pairs)


def _relative(resolved: str, folders: tuple[str, ...]) -> Answer:
    """A relative path (or pattern), the working directory unknown: possibly in a folder when it climbs out, or
    when it starts with the folder's own last parts, written out (`.ssh/x`, `.ss?/x`), or has them after a `**`,
    which may be no part at all (`**/.aws/*`); not `*/x`: a part that starts with a wildcard names no folder
    here, or `**/*.py` would be anywhere."""
    if resolved == ".." or resolved.startswith("../"):
        return None  # it climbs out of a working directory toolkeeper does not know
    parts = _parts(resolved)
    starts = [0] + [index + 1 for index, part in enumerate(parts) if part == "**"]
    for found in folders:
        tail = [part for part in _parts(found) if part != "~"]
        if any(_begins_as(parts[start:], tail[-size:]) for start in starts for size in range(1, len(tail) + 1)):
            return None
    return False


def _begins_as(parts: list[str], names: list[str]) -> bool:
    return len(parts) >= len(names) and all(
        not globs.has_magic(part[:1]) and globs.overlap(part, name) for part, name in zip(parts, names, strict=False))


def under(path: str | None, folders: tuple[str, ...], workdir: str | None) -> Answer:
    """Whether `path` is one of `folders` (resolved by `folder`) or inside one; a pattern the shell expands
    (`~/.ss?/id_rsa`, `/home/*/.aws`) may be: unknown, when some path it matches is."""
    if path is None or "\x00" in path or through_link(resolve(path, workdir)):
        return None
    answers = [_in_workdir(path, workdir, exact=False)] if WORKDIR in folders else []
    others = tuple(found for found in folders if found != WORKDIR)
    if others:
        answers.append(_under(path, others, workdir))
    return any_of(answers)


def reaches(path: str | None, folders: tuple[str, ...], workdir: str | None) -> Answer:
    """Whether `path` is in one of `folders`, or is a folder one of them may be in: a search, or a read of all
    that is in it, reaches in from there (`~` and `/` reach `~/.aws`; `src` does not)."""
    if path is None:
        return None
    return any_of([under(path, folders, workdir), under(posixpath.join(path or ".", "**"), folders, workdir)])


def _under(path: str, folders: tuple[str, ...], workdir: str | None) -> Answer:
    resolved = resolve(path, workdir)
    if not _placed(resolved):
        return _relative(resolved, folders)
    if globs.has_magic(resolved):
        fixed = _fixed_start(resolved)  # every path the pattern matches is under its fixed start
        if any_of(_compare(fixed, found, exact=False) for found in folders):
            return True
        return None if any(_pattern_meets(resolved, found, exact=False) for found in folders) else False
    return any_of(_compare(resolved, found, exact=False) for found in folders)


def _fixed_start(pattern: str) -> str:
    """The folder a placed pattern starts from: its parts before the first that holds a wildcard."""
    parts = pattern.split("/")
    first = next(index for index, part in enumerate(parts) if globs.has_magic(part))
    return "/".join(parts[:first]) or "/"


def _in_workdir(path: str, workdir: str | None, exact: bool) -> Answer:
    """Whether `path` is the working directory (`exact`) or in it. Not known: a relative path is in it (and
    `.` is it), unless it climbs out with `..`; a placed one may or may not be."""
    if workdir and _placed(workdir):
        place = (folder(workdir),)
        return one_of(path, place, workdir) if exact else under(path, place, workdir)
    resolved = resolve(path, None)
    if _placed(resolved) or resolved == ".." or resolved.startswith("../"):
        return None
    return resolved == WORKDIR if exact else True


def one_of(path: str | None, folders: tuple[str, ...], workdir: str | None) -> Answer:
    """Whether `path` is one of `folders` itself, or a pattern over everything in one (`/*`, `~/.*`): what `rm
    -rf` must never be given. A relative path where the working directory is not known: `.` and `..` may be
    anything (None); another relative path is inside the project (False)."""
    if path is None or "\x00" in path or through_link(resolve(path, workdir)):
        return None
    if path.startswith(("*", ".*", "{,.}*")):
        path = "./" + path  # `rm -rf *`: everything in the folder it runs in
    answers = [_in_workdir(path, workdir, exact=True)] if WORKDIR in folders else []
    others = tuple(found for found in folders if found != WORKDIR)
    if others:
        whole = GLOB_TAIL.sub("/", path)  # everything in a folder is the folder; and /home/* is every home
        answers += [_one_of(resolve(whole, workdir), others),
                    _one_of(resolve(path, workdir), others) if whole != path else False]
    return any_of(answers)


def _one_of(resolved: str, folders: tuple[str, ...]) -> Answer:
    if not _placed(resolved):
        return None if resolved in (".", "..") or resolved.startswith("../") else False
    if globs.has_magic(resolved):
        return None if any(_pattern_meets(resolved, found, exact=True) for found in folders) else False
    return any_of(_compare(resolved, found, exact=True) for found in folders)


def name_matches(path: str | None, names: tuple[str, ...]) -> Answer:
    """Whether the base name of `path` is one of `names` (globs: `.env`, `id_*`); when it is itself a pattern
    (`.env*`, `.en?`), unknown if some name could match both, the files there deciding."""
    if path is None:
        return None
    resolved = resolve(path, None)
    if through_link(resolved) and (resolved.endswith("/..") or _is_link(_parts(resolved))):
        return None  # the link itself, or the folder above one: its name is not written
    name = posixpath.basename(path.rstrip("/"))
    if not globs.has_magic(name):
        return any(globs.matches(name, glob) for glob in names)
    return None if any(globs.overlap(name, glob) for glob in names) else False


ELSEWHERE = "\0elsewhere"  # a `cd` to a folder known only at run time
# Options that make a program read the paths after them from another folder (`tar -C ~ -czf x.tgz .ssh`).
CHDIR_OPTIONS: dict[str, tuple[str, ...]] = {
    "tar": ("-C", "--directory"), "make": ("-C", "--directory"), "gmake": ("-C", "--directory"),
    "git": ("-C",), "env": ("-C", "--chdir"), "sudo": ("-D", "--chdir"), "pnpm": ("-C", "--dir"),
    "npm": ("--prefix",), "yarn": ("--cwd",), "uv": ("--directory",),
}


def of_command(command: Command, named: list[str | None], workdir: str | None,
               answer: Callable[[str | None], Answer], closed: bool = True) -> Answer:
    """A path test over the paths a command names, each from every folder the command may read it from (the
    working directory, where a `cd` before it went, where a `-C DIR` sends it): `answer` gets the path as from
    there (None: not known). With arguments known only at run time (xargs), unknown unless it holds."""
    answers = []
    for where in folders_run_in(workdir, (*command.moved, *chdirs(command))):
        answers += [answer(_from(path, where)) for path in named]
    if command.open_arguments and closed:
        answers.append(None)
    return any_of(answers)


def _from(path: str | None, where: str | None) -> str | None:
    """`path` as read from the folder `where` (None: the working directory; ELSEWHERE: not known)."""
    if path is None or (_placed(path) and not path.startswith(("~+", "~-"))):
        return path
    if where == ELSEWHERE:
        return None
    return resolve(path, where) if where else path


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


def chdirs(command: Command) -> tuple[str | None, ...]:
    """The folders a program's `-C DIR` options send it to, in order (each from the one before, as tar, make and
    git read them); None for one known only at run time. Old-style `tar czCf` cannot be followed: None."""
    options = CHDIR_OPTIONS.get(command.program or "")
    if not options:
        return ()
    words = list(command.argv[1:])
    found: list[str | None] = []
    if command.program == "tar" and words and words[0] and not words[0].startswith("-") and "C" in words[0]:
        found.append(None)
    for index, word in enumerate(words):
        following = words[index + 1] if index + 1 < len(words) else None
        if word is None:
            found.append(None)  # it may be `-C`, and its folder anything
        elif (folder_given := _chdir(word, following, options)) is not False:
            found.append(folder_given)
    return tuple(found)


def _chdir(word: str, following: str | None, options: tuple[str, ...]) -> str | bool | None:
    """The folder one word sends the program to (`-C DIR`, `-CDIR`, `-xzC DIR`, `--directory=DIR`, `--dir DIR`),
    None when it is the next word and that is not known; False when the word is no such option."""
    if word.startswith("--"):
        name, equals, value = word.partition("=")
        if len(name) < 5 or not any(option.startswith(name) for option in options if option.startswith("--")):
            return False
        return value if equals else following
    for option in (option for option in options if not option.startswith("--")):
        letter = option[1]
        if word.startswith("-") and letter in word[1:]:
            rest = word[word.index(letter, 1) + 1:]
            return rest or following
    return False


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
