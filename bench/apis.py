"""`bench/overhead.py`'s (c) and (d) alone: a Responses and a Messages turn against a Chat Completions one.

The same mock model server and the same toolkeeper process as `bench/overhead.py`
(pinned as it pins them), no floor: each case runs the direct path, toolkeeper's
Chat Completions turn and the API's turn in five slices taken in turn, and prints
toolkeeper's CPU per request for the API over its Chat Completions one (the
median of the paired slices: `overhead.compare`). `--repeat N` runs the whole
set N times, for the spread.

    flock /tmp/tk-bench.lock python bench/apis.py             # about a minute
    flock /tmp/tk-bench.lock python bench/apis.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead


async def run(quick: bool, repeat: int) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="tk-apis-"))
    agent = workdir / "agent.yaml"
    agent.write_text("upstream: http://127.0.0.1:9/v1\nyolo: true\ntools:\n"
                     "  - name: noop\n    description: Do nothing. Returns nothing.\n"
                     "    command: [/bin/true]\n")
    mock_port, tk_port = overhead.free_port(), overhead.free_port()
    mock_url = f"http://127.0.0.1:{mock_port}/v1"
    processes = [
        subprocess.Popen([sys.executable, str(Path(overhead.__file__).resolve()), "--serve-mock", str(mock_port)]),
        subprocess.Popen([sys.executable, "-m", "toolkeeper", "serve", str(agent), "--port", str(tk_port),
                          "--upstream", mock_url, "--log-level", "WARNING"], cwd=overhead.ROOT,
                         stdout=subprocess.DEVNULL),
    ]
    overhead.pin(processes)
    urls = {"direct": mock_url, "toolkeeper": f"http://127.0.0.1:{tk_port}/v1"}
    try:
        for url in urls.values():
            await overhead.wait_ready(url)
        sizes = {1: 300 if quick else 2000, 32: 600 if quick else 6000}
        for _ in range(repeat):
            await overhead.responses_cases(urls, {"toolkeeper": processes[1].pid}, sizes)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--repeat", type=int, default=1, help="run the set so many times (1)")
    args = parser.parse_args()
    return asyncio.run(run(args.quick, args.repeat))


if __name__ == "__main__":
    sys.exit(main())
