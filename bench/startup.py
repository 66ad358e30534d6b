"""What starting `toolkeeper hook` and `toolkeeper mcp` costs, against a bare Python start, in one run.

Both are processes an agent starts: `toolkeeper hook AGENT` before and after
each of its tool calls, `toolkeeper mcp AGENT_FILE` at each session's start.
What they cost is mostly the interpreter's start and the modules imported.

(a) the hook: a real `toolkeeper serve` on 127.0.0.1 (an agent file, a rule
allowing `echo`) answers POST /toolkeeper/hooks; each run is one process, the
Claude Code pre event on stdin, timed from spawn to exit, three ways:

- `python -c pass`: the interpreter's start alone;
- the floor: a Python one-liner sending the same POST with urllib and printing
  the answer (what any hook written in Python costs);
- `toolkeeper hook claude-code --url URL`, as the agent runs it (the venv's
  `toolkeeper` script), its answer checked (allow, by the rule).

(b) `toolkeeper mcp AGENT_FILE` (one declared tool): from spawn to the answer
of the JSON-RPC `initialize` sent on its stdin, against `python -c pass` and
the SDK's floor: a server on the same MCP SDK (its low-level server, one
tool) answering the same `initialize` (importing the SDK is most of it); and
from spawn to the answer of the `tools/list` sent after it (toolkeeper builds
its app for that one).

The ways run interleaved (each round runs each once, in a rotated order) so
the machine's noise falls on all alike; the measured processes are pinned to
core 0 and serve to the last core (taskset). The script prints the median and
p90 of each, in seconds, and their ratios.

    python bench/startup.py              # 40 rounds of (a), 13 of (b)
    python bench/startup.py --quick      # a smoke run
    python bench/startup.py --importtime # also the top imports of each (python -X importtime)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PYTHON = sys.executable
SCRIPT = Path(PYTHON).with_name("toolkeeper")
TOOLKEEPER = [str(SCRIPT)] if SCRIPT.exists() else [PYTHON, "-m", "toolkeeper"]
AGENT = """
upstream: http://127.0.0.1:9/v1
tools:
  - name: say
    description: Print a short text.
    command: [echo, "{{text}}"]
    tier: silent
    parameters:
      text: {type: string, description: what to print}
"""
RULES = """
rules:
  - id: echo-is-fine
    effect: allow
    reason: echo only prints
    when: {source: agent, tool: Bash, arguments: {command: {runs: {program: echo}}}}
"""
EVENT = {"session_id": "bench", "transcript_path": "/tmp/bench.jsonl", "cwd": "/tmp", "permission_mode": "default",
         "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "echo hi"}}
FLOOR = ("import json,sys,urllib.request as u;e=json.load(sys.stdin);"
         "r=u.Request(sys.argv[1]+'/toolkeeper/hooks',data=json.dumps({'agent':'claude-code','event':e}).encode(),"
         "headers={'Content-Type':'application/json'},method='POST');"
         "print(u.build_opener(u.ProxyHandler({})).open(r,timeout=30).read().decode())")
# the floor of (b): an MCP server on the same SDK (its low-level server, one tool), as little as answers initialize
MCP_FLOOR = """
import asyncio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name="say", inputSchema={"type": "object"})])

async def main():
    server = Server("floor", version="1", on_list_tools=list_tools)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())

asyncio.run(main())
"""
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "bench", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def pinned(core: int, argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *argv] if shutil.which("taskset") else argv


def environment() -> dict[str, str]:
    """The tester's TOOLKEEPER_* settings left out, as an agent runs its hook."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLKEEPER_")} | {
        "TOOLKEEPER_LOG_LEVEL": "WARNING"}


def start_serve(folder: Path) -> tuple[subprocess.Popen, str]:
    (folder / "rules.yaml").write_text(RULES)
    with (folder / "serve.log").open("w") as log:  # read when it does not start
        serve = subprocess.Popen(pinned(os.cpu_count() - 1, [
            *TOOLKEEPER, "serve", str(folder / "agent.yaml"), "--port", "0", "--policy", str(folder / "rules.yaml"),
            "--consent", "none"]), stdout=subprocess.PIPE, stderr=log, text=True, env=environment(),
            start_new_session=True)
    line = serve.stdout.readline()
    if "listening on http://" not in line:
        serve.kill()
        raise SystemExit(f"serve did not start: {line!r} {(folder / 'serve.log').read_text()[-2000:]}")
    return serve, "http://" + line.split("http://", 1)[1].split()[0].removesuffix("/v1")


def run_once(argv: list[str], stdin: bytes, expect: bytes = b"") -> float:
    started = time.perf_counter()
    done = subprocess.run(pinned(0, argv), input=stdin, capture_output=True, env=environment(), timeout=60)
    took = time.perf_counter() - started
    if done.returncode != 0 or expect not in done.stdout:
        raise SystemExit(f"{argv[:4]}... failed ({done.returncode}): {done.stdout[:300]!r} {done.stderr[-600:]!r}")
    return took


def mcp_once(argv: list[str], *, listing: bool = True) -> tuple[float, float, bytes]:
    """Seconds from spawn to `initialize` answered and to the first `tools/list` answered (0 unless `listing`),
    and what the process wrote on stderr before `initialize` was answered."""
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        process = subprocess.Popen(pinned(0, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                   env=environment(), start_new_session=True)
        try:
            answer = _exchange(process, INITIALIZE)
            ready = time.perf_counter() - started
            said = _read_all(errors)
            if "serverInfo" not in answer.get("result", {}):
                raise SystemExit(f"{argv[:4]}... did not answer initialize: {answer} {said[-600:]!r}")
            listed = 0.0
            if listing:
                process.stdin.write(json.dumps(INITIALIZED).encode() + b"\n")
                tools = _exchange(process, LIST_TOOLS)
                listed = time.perf_counter() - started
                if not tools.get("result", {}).get("tools"):
                    raise SystemExit(f"{argv[:4]}... listed no tools: {tools} {_read_all(errors)[-600:]!r}")
        finally:
            os.killpg(process.pid, signal.SIGKILL)  # what it would do next is not startup
            process.wait()
            process.stdin.close()
            process.stdout.close()
    return ready, listed, said


def _exchange(process: subprocess.Popen, request: dict) -> dict:
    process.stdin.write(json.dumps(request).encode() + b"\n")
    process.stdin.flush()
    line = process.stdout.readline()
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("id") != request["id"]:
        raise SystemExit(f"no answer to {request['method']}: {line[:300]!r}")
    return answer


def _read_all(file) -> bytes:
    file.seek(0)
    return file.read()


def interleaved(ways: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    for way in ways.values():  # warm: the page cache, serve's first request, the store's file
        way()
    times: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for index in range(rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            times[name].append(ways[name]())
    return times


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def report(title: str, times: dict[str, list[float]], against: list[str]) -> None:
    print(title)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        ratios = "   ".join(f"{medians[name] / medians[other]:5.2f}x {other}" for other in against if other != name)
        print(f"  {name:28} median {medians[name]:.3f} s   p90 {p90(values):.3f} s   {ratios}")


def top_imports(stderr: bytes, count: int = 12) -> list[str]:
    """The imports that took longest, their own and their children's time (python -X importtime)."""
    rows = []
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            own, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((int(cumulative), int(own), name.rstrip()))
    top = sorted(rows, reverse=True)[:count]
    return [f"    {cumulative / 1000:7.1f} ms  {name}" for cumulative, _, name in top] + [
        f"    {len(rows)} modules, {sum(own for _, own, _ in rows) / 1000:.1f} ms in all"]


def importtime(url: str, agent_file: Path) -> None:
    hooked = subprocess.run(pinned(0, [PYTHON, "-X", "importtime", "-m", "toolkeeper", "hook", "claude-code",
                                       "--url", url]),
                            input=json.dumps(EVENT).encode(), capture_output=True, env=environment(), timeout=60)
    print("python -X importtime -m toolkeeper hook claude-code --url URL: the longest imports (cumulative)")
    print("\n".join(top_imports(hooked.stderr)))
    _, _, said = mcp_once([PYTHON, "-X", "importtime", "-m", "toolkeeper", "mcp", str(agent_file)], listing=False)
    print("python -X importtime -m toolkeeper mcp AGENT_FILE, until initialize is answered: the longest imports")
    print("\n".join(top_imports(said)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--rounds", type=int, help="rounds of the hook's ways (the mcp's: a third as many, >= 3)")
    parser.add_argument("--importtime", action="store_true", help="also print the top imports of each")
    args = parser.parse_args()
    rounds = args.rounds or (4 if args.quick else 40)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "agent.yaml").write_text(AGENT)
        (folder / "mcp").mkdir()
        mcp_agent = folder / "mcp" / "agent.yaml"  # its own store and trail, beside serve's
        mcp_agent.write_text(AGENT)
        serve, url = start_serve(folder)
        try:
            event = json.dumps(EVENT).encode()
            hook = interleaved({
                "python -c pass": lambda: run_once([PYTHON, "-c", "pass"], b""),
                "floor (urllib one-liner)": lambda: run_once([PYTHON, "-c", FLOOR, url], event, b'"allow"'),
                "toolkeeper hook": lambda: run_once([*TOOLKEEPER, "hook", "claude-code", "--url", url], event,
                                                    b'"permissionDecision": "allow"'),
            }, rounds)
            listed: dict[str, list[float]] = {"SDK floor": [], "toolkeeper mcp": []}

            def mcp_way(name: str, argv: list[str]) -> Callable[[], float]:
                def way() -> float:
                    ready, to_list, _ = mcp_once(argv)
                    listed[name].append(to_list)
                    return ready
                return way

            times = interleaved({
                "python -c pass": lambda: run_once([PYTHON, "-c", "pass"], b""),
                "SDK floor": mcp_way("SDK floor", [PYTHON, "-c", MCP_FLOOR]),
                "toolkeeper mcp": mcp_way("toolkeeper mcp", [*TOOLKEEPER, "mcp", str(mcp_agent)]),
            }, max(3, rounds // 3))
            ready = {"python -c pass": times["python -c pass"], **{f"{name} (initialize)": times[name]
                                                                  for name in listed}}
            to_list = {f"{name} (tools/list)": runs[1:] for name, runs in listed.items()}  # [0]: the warm-up
            print(f"process start to exit (hook), to initialize answered and to tools/list answered (mcp), pinned "
                  f"to core 0; {rounds} rounds of the hook, {max(3, rounds // 3)} of mcp")
            report("(a) toolkeeper hook claude-code --url URL, against a running serve", hook,
                   ["python -c pass", "floor (urllib one-liner)"])
            report("(b) toolkeeper mcp AGENT_FILE, to the initialize answer", ready,
                   ["python -c pass", "SDK floor (initialize)"])
            report("    and to the first tools/list answer (after notifications/initialized)", to_list,
                   ["SDK floor (tools/list)"])
            if args.importtime:
                importtime(url, mcp_agent)
        finally:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(10)


if __name__ == "__main__":
    main()
