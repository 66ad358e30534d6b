"""Instructions per request, counted by callgrind: what each API's turn costs toolkeeper, free of the machine's noise.

toolkeeper runs under valgrind's callgrind (user space only: the kernel's share,
the sends and the polls, is not counted), against the mock model server of
`bench/overhead.py`, which runs natively. Instrumentation starts once the
server answers; for each case the same load is sent as a warm-up, the
counters are zeroed (`callgrind_control --zero`), the measured requests are
sent, and the counters dumped: the total over the requests is the figure.
Each request differs from the last by a counter, as in `bench/overhead.py`.

Cases: Chat Completions, Responses and Messages (`bench/overhead.py`'s (a),
(c) and (d): one answer, no declared call), streamed and not, at each
concurrency asked; each API's figure is also printed against Chat's of the
same streaming and concurrency. `--floor` measures the bare aiohttp
pass-through the same way (Chat Completions only).

    flock /tmp/tk-bench.lock python bench/instructions.py                  # c1 and c32, 300 requests each
    flock /tmp/tk-bench.lock python bench/instructions.py --quick          # 60 requests, c1 only
    flock /tmp/tk-bench.lock python bench/instructions.py --apis responses --stream yes -c 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # the mock model server and the floor

ROOT = overhead.ROOT
APIS = {  # name: path, the key of the conversation, fields the API needs
    "chat": ("/chat/completions", "messages", {}),
    "responses": ("/responses", "input", {}),
    "messages": ("/messages", "messages", {"max_tokens": 64}),
}
QUESTION = overhead.MESSAGES[0]["content"]


def body_for(api: str, stream: bool) -> dict:
    _, key, extra = APIS[api]
    return {"model": "b", key: [{"role": "user", "content": QUESTION}], "stream": stream, **extra}


async def load(url: str, path: str, body: dict, concurrency: int, total: int, counter: list[int]) -> None:
    """`total` requests at `concurrency`, each different (a counter in the last message), each checked."""
    key = "messages" if "messages" in body else "input"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue = iter(range(total))

        async def worker() -> None:
            for _ in queue:
                counter[0] += 1
                last = body[key][-1]
                data = orjson.dumps({**body, key: [*body[key][:-1], {**last, "content": f"{QUESTION} #{counter[0]}"}]})
                async with session.post(url + path, data=data, headers={"Content-Type": "application/json"}) as r:
                    answer = await r.read()
                    if r.status != 200 or (body["stream"] and not answer.rstrip().endswith(
                            (b"[DONE]", b"}"))):
                        raise RuntimeError(f"{path}: {r.status} {answer[:200]!r}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)


def dumped_total(directory: Path, pid: int, before: set[Path]) -> int:
    """The instruction count of the dump `callgrind_control --dump` just wrote (its `totals:` line)."""
    for _ in range(600):
        new = sorted(set(directory.glob(f"cg.out.{pid}*")) - before, key=lambda p: p.stat().st_mtime)
        for path in new:
            text = path.read_text(errors="replace")
            found = re.search(r"^(?:totals|summary): (\d+)", text, re.MULTILINE)
            if found:
                return int(found.group(1))
        time.sleep(0.1)
    raise RuntimeError("callgrind wrote no dump")


async def wait_ready(url: str, path: str, body: dict) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(1200):
            try:
                async with session.post(url + path, json=body) as answer:
                    await answer.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.25)
    raise RuntimeError(f"{url} did not start")


async def measure(pid: int, directory: Path, url: str, api: str, stream: bool, concurrency: int, total: int,
                  counter: list[int]) -> float:
    """Instructions per request of one case: a warm-up, then `total` requests counted."""
    path = APIS[api][0]
    body = body_for(api, stream)
    await load(url, path, body, concurrency, max(concurrency * 2, 40), counter)
    control(pid, "--zero")
    await load(url, path, body, concurrency, total, counter)
    before = set(directory.glob(f"cg.out.{pid}*"))
    control(pid, "--dump")
    return dumped_total(directory, pid, before) / total


def start(argv: list[str], directory: Path, core: int | None) -> subprocess.Popen:
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={directory}/cg.out.%p",
                "--dump-instr=no", "--compress-strings=no"]
    pinned = ["taskset", "-c", str(core)] if core is not None else []
    return subprocess.Popen([*pinned, *valgrind, *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=open(directory / "valgrind.log", "ab"))


def cores() -> tuple[int | None, set[int] | None]:
    """The measured process's core (the last) and the others, for the mock and this client."""
    mine = sorted(os.sched_getaffinity(0))
    return (mine[-1], set(mine[:-1])) if len(mine) > 1 else (None, None)


async def run(args: argparse.Namespace) -> int:
    directory = Path(tempfile.mkdtemp(prefix="tk-instr-"))
    agent = directory / "agent.yaml"
    agent.write_text("upstream: http://127.0.0.1:9/v1\nyolo: true\ntools:\n"
                     "  - name: noop\n    description: Do nothing. Returns nothing.\n"
                     "    command: [/bin/true]\n")
    measured_core, others = cores()
    if others:
        os.sched_setaffinity(0, others)
    mock_port, port = overhead.free_port(), overhead.free_port()
    mock_url = f"http://127.0.0.1:{mock_port}/v1"
    me = [sys.executable, str(Path(overhead.__file__).resolve())]
    mock = subprocess.Popen([*me, "--serve-mock", str(mock_port)])
    if others:
        os.sched_setaffinity(mock.pid, others)
    if args.floor:
        argv = [*me, "--serve-floor", str(port), mock_url]
    else:
        argv = [sys.executable, "-m", "toolkeeper", "serve", str(agent), "--port", str(port), "--upstream",
                mock_url, "--log-level", "WARNING", *args.serve_args]
    server = start(argv, directory, measured_core)
    url = f"http://127.0.0.1:{port}/v1"
    counter = [0]
    figures: dict[tuple[str, bool, int], float] = {}
    try:
        await wait_ready(mock_url, "/chat/completions", body_for("chat", False))
        await wait_ready(url, "/chat/completions", body_for("chat", False))
        pid = server.pid
        control(pid, "--instr=on")
        apis = ["chat"] if args.floor else [api for api in APIS if api in args.apis]
        streams = {"no": (False,), "yes": (True,), "both": (False, True)}[args.stream]
        print(f"{'floor' if args.floor else 'toolkeeper'}: instructions per request (callgrind, user space), "
              f"{args.requests} requests a case")
        print(f"{'api':<11}{'streamed':>9}{'conc':>6}{'instr/req':>12}{'/ chat':>8}")
        for stream in streams:
            for concurrency in args.concurrency:
                for api in apis:
                    figure = await measure(pid, directory, url, api, stream, concurrency, args.requests, counter)
                    figures[api, stream, concurrency] = figure
                    chat = figures.get(("chat", stream, concurrency))
                    ratio = f"{figure / chat:>8.2f}" if chat and api != "chat" else f"{'':>8}"
                    print(f"{api:<11}{'yes' if stream else 'no':>9}{concurrency:>6}{figure / 1000:>10.0f} k{ratio}",
                          flush=True)
    finally:
        server.terminate()
        mock.terminate()
        for process in (server, mock):
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        if args.keep:
            print(f"callgrind's dumps: {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="measured requests a case (300)")
    parser.add_argument("-c", "--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--apis", nargs="+", default=list(APIS), choices=list(APIS))
    parser.add_argument("--stream", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--floor", action="store_true", help="the bare aiohttp pass-through instead (chat only)")
    parser.add_argument("--quick", action="store_true", help="60 requests a case, concurrency 1")
    parser.add_argument("--keep", action="store_true", help="keep the callgrind dumps (their directory is printed)")
    parser.add_argument("serve_args", nargs="*", help="more arguments for toolkeeper serve (after --)")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.concurrency = 60, [1]
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
