"""mitmproxy's own environment, made once on first use: it never shares toolkeeper's.

mitmproxy pins exact versions of h11, cryptography and others that clash with
toolkeeper's (the openai client needs h11 >= 0.16, mitmproxy 11 <= 0.14), and
its releases from 11.1 on need Python >= 3.12. So `toolkeeper intercept`
keeps it in a virtual environment of its own: the newest mitmproxy known here
on a Python >= 3.12 when one is installed, else 11.0.2 on Python 3.11.

    $TOOLKEEPER_MITMPROXY_ENV, else ~/.cache/toolkeeper/mitmproxy
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

NEWEST = "12.3.1"  # the newest mitmproxy release tried with this toolkeeper: Python >= 3.12
FOR_311 = "11.0.2"  # the last release for Python 3.11
ENV_VARIABLE = "TOOLKEEPER_MITMPROXY_ENV"
MARK = "toolkeeper-mitmproxy.json"  # in the environment: which mitmproxy on which Python, once installed


class EnvironmentProblem(Exception):
    """No mitmproxy environment, and no way to make one: the message says what to install."""


def default_directory() -> Path:
    given = os.environ.get(ENV_VARIABLE)
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "toolkeeper" / "mitmproxy"


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        done = subprocess.run([python, "-c", "import sys, venv, ensurepip; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    major, minor = done.stdout.split()
    return int(major), int(minor)


def find_python() -> tuple[str, tuple[int, int]]:
    """A Python >= 3.12 when one is installed (on PATH or under pyenv), else a 3.11 (this one, if it is)."""
    candidates = [found for name in ("python3.14", "python3.13", "python3.12") if (found := shutil.which(name))]
    home = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates += sorted(glob.glob(str(home / "versions" / "3.1[2-9]*" / "bin" / "python3")), reverse=True)
    candidates += [sys.executable, shutil.which("python3.11") or "", shutil.which("python3") or ""]
    fallback = None
    for python in filter(None, candidates):
        version = _version_of(python)
        if version is not None and version >= (3, 12):
            return python, version
        if version == (3, 11) and fallback is None:
            fallback = (python, version)
    if fallback is None:
        raise EnvironmentProblem("mitmproxy needs Python 3.11 or newer (3.12+ for its current releases), with its "
                                 "venv module: install python3.12 (or python3.11-venv)")
    return fallback


def _made(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MARK).read_text())
    except (OSError, ValueError):
        return None


def _runs(mitmdump: Path) -> bool:
    try:
        return subprocess.run([str(mitmdump), "--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def mitmdump(directory: Path | None = None, *, say=print) -> tuple[Path, str]:
    """The environment's mitmdump and what it is ("mitmproxy 12.3.1 on Python 3.13"), made first if needed: one
    maker at a time (a lock beside it), its mark written last, so a half-made one is made again."""
    directory = directory or default_directory()
    if found := _found(directory):  # no lock to read one that is there (its folder may be read-only)
        return found
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with open(directory.parent / f"{directory.name}.toolkeeper-lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return _found(directory) or _made_now(directory, say)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot make mitmproxy's environment in {directory}: {exc.strerror or exc}. Set {ENV_VARIABLE} to a "
            f"folder toolkeeper may write, or to one made by hand (python3.12 -m venv DIR && DIR/bin/pip install "
            f"mitmproxy=={NEWEST}; on Python 3.11, mitmproxy=={FOR_311})") from None


def _found(directory: Path) -> tuple[Path, str] | None:
    """An environment made here (its mark says so: trusted without running it), or by hand (it must run)."""
    made, mitmdump = _made(directory), directory / "bin" / "mitmdump"
    if not mitmdump.exists():
        return None
    if made is not None:
        return (mitmdump, made["what"]) if made.get("state") == "made" else None
    return (mitmdump, f"the mitmproxy in {directory}") if _runs(mitmdump) else None


def _made_now(directory: Path, say) -> tuple[Path, str]:
    made = _made(directory)
    if directory.exists() and any(directory.iterdir()) and made is None:
        raise EnvironmentProblem(f"{directory} is not empty and is not a mitmproxy environment toolkeeper made: "
                                 f"set {ENV_VARIABLE} to another folder")
    python, version = find_python()
    release = NEWEST if version >= (3, 12) else FOR_311
    what = f"mitmproxy {release} on Python {version[0]}.{version[1]}"
    say(f"toolkeeper: making mitmproxy's environment in {directory} ({what}); this happens once")
    try:
        subprocess.run([python, "-m", "venv", "--clear", str(directory)], check=True, capture_output=True, text=True)
        (directory / MARK).write_text(json.dumps({"state": "making", "what": what}))
        subprocess.run([str(directory / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", f"mitmproxy=={release}"], check=True, capture_output=True,
                       text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = (getattr(exc, "stderr", "") or str(exc)).strip().splitlines()[-1:] or [""]
        raise EnvironmentProblem(
            f"cannot make mitmproxy's environment in {directory}: {detail[0]}. Make it yourself ({python} -m venv "
            f"{directory} && {directory}/bin/pip install mitmproxy=={release}), or set {ENV_VARIABLE} to one "
            "that has mitmdump") from None
    (directory / MARK).write_text(json.dumps({"state": "made", "what": what, "release": release}))
    return directory / "bin" / "mitmdump", what
