"""The programs that run another program, and how each reads its own options (commands.py unwraps them).

Each wrapper's options that take a value are listed, so that `sudo -u root rm`
is rm run as root, never a program called `root`; GNU long options are taken
by any unambiguous start (`--us` is `--user`), as getopt_long takes them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Wrapper:
    """A program that runs another: its options that take a value, and the operands it reads before it."""

    valued: frozenset[str] = frozenset()
    operands: int = 0  # timeout's duration, chroot's root, taskset's mask
    transparent: bool = True  # an allow rule looks through it (sudo, su and chroot change who or where: not)
    stops: frozenset[str] = frozenset()  # options after which nothing runs (`command -v`)


def wrapper_of(valued: str = "", operands: int = 0, transparent: bool = True, stops: str = "") -> Wrapper:
    return Wrapper(frozenset(valued.split()), operands, transparent, frozenset(stops.split()))


WRAPPERS: dict[str, Wrapper] = {
    "env": wrapper_of("-u --unset -C --chdir -S --split-string -P --default-signal --ignore-signal --block-signal"),
    "sudo": wrapper_of("-u --user -g --group -C --close-from -D --chdir -h --host -p --prompt -r --role -t --type "
               "-T --command-timeout -U --other-user -R --chroot", transparent=False, stops="-l --list -v -V -e"),
    "doas": wrapper_of("-u -C", transparent=False),
    "pkexec": wrapper_of("--user", transparent=False),
    "runuser": wrapper_of("-u --user -g --group -G --supp-group -s --shell", transparent=False),
    "chroot": wrapper_of("--userspec --groups", operands=1, transparent=False),
    "nohup": wrapper_of(), "time": wrapper_of("-f --format -o --output"), "builtin": wrapper_of(),
    "coproc": wrapper_of(), "unbuffer": wrapper_of(),
    "command": wrapper_of(stops="-v -V"),
    "exec": wrapper_of("-a"),
    "nice": wrapper_of("-n --adjustment"),
    "timeout": wrapper_of("-s --signal -k --kill-after", operands=1),
    "stdbuf": wrapper_of("-i --input -o --output -e --error"),
    "setsid": wrapper_of(), "ionice": wrapper_of("-c --class -n --classdata -p --pid -P --pgid -u --uid"),
    "taskset": wrapper_of(operands=1), "busybox": wrapper_of(),
    "xargs": wrapper_of("-a --arg-file -d --delimiter -E -I -L -n --max-args -P --max-procs -s --max-chars "
                "--process-slot-var"),
    "flock": wrapper_of("-w --timeout -E --conflict-exit-code", operands=1),
    "watch": wrapper_of("-n --interval -d --differences -q --equexit"),
    "chrt": wrapper_of("-T --sched-runtime -P --sched-period -D --sched-deadline", operands=1),
    "nsenter": wrapper_of("-t --target -S --setuid -G --setgid", transparent=False),
    "unshare": wrapper_of("--map-user --map-group --setuid --setgid --wd --root --propagation", transparent=False),
    "strace": wrapper_of("-o --output -e -p -s -u -a -b -E -I -O -P -S -X"),
    "ltrace": wrapper_of("-o --output -e -p -s -u -a -n -A -D -F -l -L"),
}


def stops(option: str, wrapper: Wrapper) -> bool:
    """An option after which the wrapper runs nothing (`command -v`); in a group, up to the first letter that
    takes a value (`sudo -uvagrant` is the user `vagrant`, not `-v`)."""
    if option in wrapper.stops or option.startswith("--"):
        return option in wrapper.stops
    for letter in option[1:]:
        if f"-{letter}" in wrapper.stops:
            return True
        if f"-{letter}" in wrapper.valued:
            return False
    return False


def takes_value(option: str, wrapper: Wrapper) -> bool:
    """The next word is this option's value: `-u` or `--user` (or `--us`: GNU tools take any unambiguous start of
    a long option), or a group of short options whose last takes one (`sudo -iu root`); `-uroot` and
    `--user=root` carry theirs."""
    if option.startswith("--"):
        return "=" not in option and any(valued.startswith(option) for valued in wrapper.valued
                                         if valued.startswith("--"))
    if option in wrapper.valued:
        return True
    for index, letter in enumerate(option[1:]):
        if f"-{letter}" in wrapper.valued:
            return index == len(option) - 2
    return False


def splits(option: str) -> bool:
    """env's -S (alone, last of a group, with its value attached) or --split-string (or a start of it)."""
    if option.startswith("--"):
        return len(option.split("=")[0]) >= 3 and "--split-string".startswith(option.split("=")[0])
    return option.startswith("-") and "S" in option[1:]


def split_string(option: str, rest: list[str | None], unresolved: list[str]) -> list[str | None] | None:
    """The command `env -S STRING` runs: the string split into words, then the words after it."""
    if option.startswith("--"):
        value = option.partition("=")[2] if "=" in option else (rest.pop(0) if rest else None)
    else:
        attached = option[option.index("S") + 1:]
        value = attached or (rest.pop(0) if rest else None)
    if value is None:
        unresolved.append("env -S splits a string known only at run time")
        return None
    try:
        return [*shlex.split(value), *rest]
    except ValueError:
        unresolved.append("env -S splits a string that does not split")
        return None


def command_option(given: str | None) -> bool:
    """-c (or a group ending with it: -qc), --command, --session-command, or a start of either (--comm)."""
    if not given or not given.startswith("-"):
        return False
    if not given.startswith("--"):
        return given.endswith("c")
    option = given.split("=")[0]
    return len(option) > 3 and ("--command".startswith(option) or "--session-command".startswith(option))
