"""What scanning for secrets costs a request, against the same request without scanning, in one run.

toolkeeper and the scripted model server run in this process, on 127.0.0.1;
each request goes through toolkeeper's Chat Completions door (`serve`'s app)
to the model and back, its history holding the agent's own tools' results,
which toolkeeper scans for secrets before the body goes upstream (the same
scan a declared tool's result gets). Three ways, taken in turn so the
machine's noise falls on all alike:

- without scanning: the scan replaced by nothing (the floor);
- uncached: the detector's memory cleared before each request (a result seen
  for the first time: what every new result costs, once);
- cached: the same history again (what every later request of a conversation
  costs: a digest of each result's text).

The results are typical tool output, with no secret in it (the usual case):
source code, prose, JSON and log lines. The script prints, for one result of
1 KiB, 16 KiB and 256 KiB and for a history of 50 results of 4 KiB, the median
request time of each way and their ratio to the floor, and the detector's own
time per result (MB/s).

    python bench/secret_scan.py            # the full run
    python bench/secret_scan.py --quick    # a smoke run
"""

from __future__ import annotations

import sys
from pathlib import Path

# this file's folder comes first on the path, and its name would stand for the standard library's `secrets`
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from aiohttp import web  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

from toolkeeper.app import build_app  # noqa: E402
from toolkeeper.policy import find_secrets, prepare_secrets  # noqa: E402
from toolkeeper.policy.secrets import CACHE  # noqa: E402
from toolkeeper.scripted import ScriptedModel, serve_scripted  # noqa: E402
from toolkeeper.settings import Settings  # noqa: E402
from toolkeeper.tools import load_agent_file  # noqa: E402
from toolkeeper.wire.apis.chat import adapter  # noqa: E402

SOURCES = sorted((ROOT / "proxy" / "toolkeeper").rglob("*.py")) + sorted((ROOT / "docs").rglob("*.md"))
AGENT = "upstream: {upstream}\nyolo: true\ntools: []\n"


def typical(size: int, seed: int) -> str:
    """`size` bytes of tool output: the project's own code and docs, a JSON document and log lines, in turn."""
    pieces, total, index = [], 0, seed
    while total < size:
        source = SOURCES[index % len(SOURCES)].read_text()
        log = "".join(f"2026-11-0{index % 9 + 1}T10:{n:02d}:00Z INFO request {index * 100 + n} served in "
                      f"{n * 3 % 17}.{n % 10} ms from cache=hit route=/v1/items/{n}\n" for n in range(20))
        document = orjson.dumps({"items": [{"id": index * 10 + n, "name": f"item {n}", "tags": ["a", "b"],
                                            "updated": "2026-11-01T09:00:00Z"} for n in range(10)]}).decode()
        for piece in (source[:4096], log, document + "\n"):
            pieces.append(piece)
            total += len(piece)
        index += 1
    return "".join(pieces)[:size]


def history(results: list[str]) -> bytes:
    messages: list[dict] = [{"role": "user", "content": "Look into the failing build."}]
    for position, result in enumerate(results):
        call_id = f"call_{position}"
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": call_id, "type": "function",
                          "function": {"name": "read_file", "arguments": f'{{"path": "src/{position}.py"}}'}}]},
                     {"role": "tool", "tool_call_id": call_id, "content": result}]
    tool = {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}
    return orjson.dumps({"model": "bench", "messages": messages, "tools": [tool]})


SCANNING = adapter.guard_results


def scanning(on: bool) -> None:
    adapter.guard_results = SCANNING if on else (lambda engine, messages, turn, **kwargs: messages)


async def timed(session: aiohttp.ClientSession, url: str, body: bytes, way: str) -> float:
    scanning(way != "none")
    if way == "uncached":
        CACHE.clear()
    started = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json",
                                                     "Authorization": "Bearer bench"}) as answer:
        await answer.read()
        if answer.status != 200:
            raise SystemExit(f"toolkeeper answered {answer.status}: {await answer.text()}")
    return time.perf_counter() - started


async def case(session: aiohttp.ClientSession, url: str, name: str, results: list[str], rounds: int) -> None:
    body = history(results)
    ways = ("none", "uncached", "cached")
    took: dict[str, list[float]] = {way: [] for way in ways}
    for way in ways:  # warm each way once: the first request of a way pays for what the others then find ready
        await timed(session, url, body, way)
    for _ in range(rounds):
        for way in ways:
            took[way].append(await timed(session, url, body, way))
    floor = statistics.median(took["none"])
    scans = []
    for result in results[:5] * (5 if len(results) == 1 else 1):
        started = time.perf_counter()
        find_secrets(result)
        scans.append(time.perf_counter() - started)
    scan = statistics.median(scans)
    size = len(results[0].encode())
    uncached, cached = statistics.median(took["uncached"]), statistics.median(took["cached"])
    print(f"{name:<24} none {floor * 1000:6.2f} ms   uncached {uncached * 1000:6.2f} ms ({uncached / floor:5.2f}x)   "
          f"cached {cached * 1000:6.2f} ms ({cached / floor:4.2f}x)   the detector: {scan * 1000:5.2f} ms a result "
          f"({size / scan / 1e6:4.1f} MB/s)")


async def run(quick: bool) -> None:
    rounds = 5 if quick else 40
    prepare_secrets()
    model = ScriptedModel([{"content": "ok", "repeat": True}])
    model_runner, model_port = await serve_scripted(model)
    with tempfile.TemporaryDirectory() as scratch:
        agent_file = Path(scratch) / "agent.yaml"
        agent_file.write_text(AGENT.format(upstream=f"http://127.0.0.1:{model_port}/v1"))
        app = build_app(load_agent_file(agent_file), Settings(store=":memory:", audit=":memory:"))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/chat/completions"  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                for size in (1024, 16 * 1024, 256 * 1024):
                    await case(session, url, f"one result of {size // 1024} KiB", [typical(size, 0)], rounds)
                    model.requests.clear()
                await case(session, url, "50 results of 4 KiB", [typical(4096, n) for n in range(50)], rounds)
        finally:
            await runner.cleanup()
            await model_runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few rounds: a smoke run")
    asyncio.run(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
