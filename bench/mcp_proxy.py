"""What toolkeeper's MCP proxy adds to a `tools/call`, against calling the same server directly, in one run.

One MCP server written with the SDK (tests/mcp/notes_server.py, its `echo`
tool) is reached two ways by the SDK's own client over stdio:

- directly: the client launches the server;
- proxied: the client launches `toolkeeper mcp`, which launches the server and
  serves its tool as `mcp__notes__echo` (rules, the pin check, two audit
  events per call, then the call sent on).

Both run the same sequential calls, interleaved in rounds so that the
machine's noise falls on both; the script prints the latency of each (p50 and
p99) and what the proxy adds. On two cores the client, toolkeeper and the
server share them: pass `--pin` to put the client on core 0 and the servers on
core 1 (taskset).

    python bench/mcp_proxy.py            # 5 rounds of 200 calls
    python bench/mcp_proxy.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTES = ROOT / "tests" / "mcp" / "notes_server.py"
AGENT = """
upstream: http://127.0.0.1:9/v1
mcp_servers:
  - name: notes
    command: {command}
    env: {{NOTES_STATE: "{state}"}}
    tier: silent
"""


def server_command(pin: bool, *argv: str) -> list[str]:
    return ["taskset", "-c", "1", *argv] if pin and shutil.which("taskset") else list(argv)


async def timed_calls(params, tool: str, count: int) -> list[float]:
    from mcp import Client

    async with Client(params) as client:
        for _ in range(20):  # warm: imports, the connection to the server, the pin
            await client.call_tool(tool, {"text": "warm"})
        times = []
        for index in range(count):
            started = time.perf_counter()
            result = await client.call_tool(tool, {"text": f"call {index}"})
            times.append(time.perf_counter() - started)
            assert not result.is_error, result
        return times


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--pin", action="store_true", help="client on core 0, servers on core 1")
    args = parser.parse_args()
    rounds, count = (1, 30) if args.quick else (5, 200)
    if args.pin and shutil.which("taskset"):
        os.sched_setaffinity(0, {0})
    from mcp import StdioServerParameters

    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / "state"
        state.mkdir()
        command = server_command(args.pin, sys.executable, str(NOTES))
        (Path(folder) / "agent.yaml").write_text(AGENT.format(command=command, state=state))
        environment = {**os.environ, "NOTES_STATE": str(state), "TOOLKEEPER_LOG_LEVEL": "WARNING"}
        direct = StdioServerParameters(command=command[0], args=command[1:], env=environment)
        toolkeeper = server_command(args.pin, sys.executable, "-m", "toolkeeper", "mcp",
                                    str(Path(folder) / "agent.yaml"), "--policy", "none")
        proxied = StdioServerParameters(command=toolkeeper[0], args=toolkeeper[1:], env=environment)
        measured: dict[str, list[float]] = {"direct": [], "proxied": []}
        for _ in range(rounds):
            measured["direct"] += await timed_calls(direct, "echo", count)
            measured["proxied"] += await timed_calls(proxied, "mcp__notes__echo", count)
    direct_p50, proxied_p50 = statistics.median(measured["direct"]), statistics.median(measured["proxied"])
    print(f"MCP tools/call over stdio, {rounds} rounds x {count} sequential calls each way")
    for name, times in measured.items():
        p50, p99 = statistics.median(times) * 1000, percentile(times, 0.99) * 1000
        print(f"  {name:8} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms")
    print(f"  added by toolkeeper: p50 {(proxied_p50 - direct_p50) * 1000:+.2f} ms "
          f"({proxied_p50 / direct_p50:.2f}x direct), p99 "
          f"{(percentile(measured['proxied'], 0.99) - percentile(measured['direct'], 0.99)) * 1000:+.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
