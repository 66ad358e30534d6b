"""What a wasm declared call costs beyond its module's own run, against an argv call.

Three tools do the same job, counting the words of a text: `word_count`, the
example's WASI module (compiled once, a fresh instance per call), and
`word_count_argv`, the same count done by `/usr/bin/wc -w` in a process. The
script measures, in one run:

- the module's own run: a fresh instance, run to its end, called directly
  (no toolkeeper), and a process's own run (`wc -w`, asyncio subprocess);
- the same calls made by a model through toolkeeper, minus a request with no
  declared call and minus the second model round (as bench/overhead.py does).

Target (issue 6): a wasm declared call adds <= 0.3 ms beyond the module's own run.

    python bench/wasm.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import overhead  # noqa: E402

ROOT = HERE.parent
AGENT = """upstream: http://127.0.0.1:9/v1
yolo: true
tools:
  - name: word_count
    description: Count the words of a text.
    parameters:
      text: {type: string, description: "The text."}
    wasm: %(wasm)s
    command: ["word_count", "{{text}}"]
  - name: word_count_argv
    description: Count the words of a text, in a process.
    parameters:
      text: {type: string, description: "The text."}
    command: ["/usr/bin/wc", "-w"]
    stdin: json
"""


def module_own_run(samples: int) -> float:
    """A fresh instance of the compiled module, run to its end, with no toolkeeper around it."""
    import wasmtime

    from toolkeeper.tools import load_agent_file

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "agent.yaml"
        path.write_text(AGENT % {"wasm": ROOT / "declared/example/wasm/word_count.wat"})
        agent = load_agent_file(path)
    from toolkeeper.runners import shared_wasm_runner

    runner = shared_wasm_runner()
    runner.ticker.ensure_started()
    tool = agent.tools["word_count"]
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        result = runner._run(tool, ["word_count", "the quick brown fox"], {})
        times.append(time.perf_counter() - started)
        assert result.stdout.text() == "4\n", result.answer()
    del wasmtime
    return statistics.median(times)


async def process_own_run(samples: int) -> float:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            "/usr/bin/wc", "-w", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        await process.communicate(b'{"text": "the quick brown fox"}')
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def run(quick: bool) -> int:
    samples = 100 if quick else 1000
    workdir = Path(tempfile.mkdtemp(prefix="tk-bench-wasm-"))
    agent = workdir / "agent.yaml"
    agent.write_text(AGENT % {"wasm": ROOT / "declared/example/wasm/word_count.wat"})
    mock_port, tk_port = overhead.free_port(), overhead.free_port()
    mock_url = f"http://127.0.0.1:{mock_port}/v1"
    tk_url = f"http://127.0.0.1:{tk_port}/v1"
    processes = [
        subprocess.Popen([sys.executable, str(HERE / "overhead.py"), "--serve-mock", str(mock_port)]),
        subprocess.Popen([sys.executable, "-m", "toolkeeper", "serve", str(agent), "--port", str(tk_port),
                          "--upstream", mock_url, "--log-level", "WARNING", "--store", ":memory:"],
                         cwd=ROOT, stdout=subprocess.DEVNULL),
    ]
    try:
        await overhead.wait_ready(mock_url)
        await overhead.wait_ready(tk_url)
        module = module_own_run(samples)
        process = await process_own_run(samples)

        async def p50(content: str, url: str) -> float:
            body = {"model": "b", "messages": [{"role": "user", "content": content}]}
            return (await overhead.measure(url, body, 1, samples, None))["p50"]

        direct = await p50("plain", mock_url)
        plain = await p50("plain", tk_url)
        wasm = await p50("wasm", tk_url)
        argv = await p50("argv", tk_url)
        wasm_added = wasm - plain - direct - module
        argv_added = argv - plain - direct - process
        print(f"wasm vs argv declared calls, concurrency 1, p50 in ms ({samples} calls each)\n")
        print(f"{'tool':<34}{'own run':>9}{'through tk':>12}{'added':>8}")
        print(f"{'word_count (wasm, cached module)':<34}{module * 1e3:>9.3f}{(wasm - plain - direct) * 1e3:>12.3f}"
              f"{wasm_added * 1e3:>8.3f}")
        print(f"{'word_count_argv (wc -w process)':<34}{process * 1e3:>9.3f}{(argv - plain - direct) * 1e3:>12.3f}"
              f"{argv_added * 1e3:>8.3f}")
        print(f"\nthe wasm call in all: {(wasm - plain - direct) * 1e3:.3f} ms, the argv call "
              f"{(argv - plain - direct) * 1e3:.3f} ms: {(argv - plain - direct) / (wasm - plain - direct):.1f}x")
    finally:
        for child in processes:
            child.terminate()
            child.wait(10)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    return asyncio.run(run(parser.parse_args().quick))


if __name__ == "__main__":
    sys.exit(main())
