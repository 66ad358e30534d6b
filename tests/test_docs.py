"""The pages' offline paths, run as written: the tutorial, the approvals, the audit and the eval how-tos.

A page marks what runs: ```LANG file=PATH offline``` writes the block to PATH (a `#!` one is made executable),
```sh offline``` blocks run in order, as one bash script, in a fresh folder, with the venv's commands on PATH,
and every line of a ```text output``` block must appear in what they print. The fresh folder holds a copy of
the repository's `declared/`, so a page's commands may run from the repository's root. A duration, `(0.1 s)`,
matches any duration, and runs of spaces match any spacing: a table of timings is still checked. Whatever the
page starts in the background is stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

PAGES = ["docs/tutorial/first-declared-tool.md", "docs/how-to/approve-calls.md", "docs/how-to/audit.md",
         "docs/how-to/measure-your-tools-with-eval.md", "docs/how-to/stop-exfiltration-after-a-prompt-injection.md",
         "docs/how-to/cap-what-an-agent-can-do.md"]
BLOCK = re.compile(r"^```(\S+)([^\n]*)\n(.*?)^```$", re.M | re.S)


def blocks(page: Path) -> tuple[dict[str, str], list[str], list[str]]:
    files, scripts, outputs = {}, [], []
    for language, info, body in BLOCK.findall(page.read_text()):
        words = info.split()
        named = [word[5:] for word in words if word.startswith("file=")]
        if "offline" in words and named:
            files[named[0]] = body
        elif "offline" in words and language == "sh":
            scripts.append(body)
        elif language == "text" and "output" in words:
            outputs += [line.strip() for line in body.splitlines() if line.strip()]
    return files, scripts, outputs


def stop_group(group: int) -> None:
    """SIGTERM to every process of the group, then wait until none is left (SIGKILL past 15 s): the next page
    binds the same ports. A group that has already gone is done."""
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_offline_commands_run_as_written(page, tmp_path):
    files, scripts, outputs = blocks(ROOT / page)
    assert scripts and outputs, f"{page} has no offline path"
    shutil.copytree(ROOT / "declared", tmp_path / "declared")  # a copy: what the page runs may write there
    for name, body in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        if body.startswith("#!"):
            path.chmod(0o755)
    script = "set -euo pipefail\n" + "\n".join(scripts)
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    environment.pop("TOOLKEEPER_ADMIN_TOKEN", None)
    # to files, not pipes: the servers started in the background keep their copies open
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        process = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=environment, stdout=out, stderr=err,
                                   start_new_session=True)
        try:
            process.wait(120)
        finally:
            stop_group(process.pid)  # the servers the page started in the background
            process.wait()
    printed, said = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert process.returncode == 0, f"{printed}\n{said}"
    for line in outputs:
        assert comparable(line) in comparable(printed), f"{page}: {line!r} not printed:\n{printed}\n{said}"


def comparable(text: str) -> str:
    """The text with every duration as one and every run of spaces as one: timings change from run to run, and
    a table's padding with them."""
    return re.sub(r" +", " ", re.sub(r"\(\d+(\.\d+)? s\)", "(... s)", text))
