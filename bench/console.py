"""What the console's trail pages cost on a large trail, and what they cost the proxy meanwhile.

A trail of N calls (20,000; --quick: 2,000) is written through the trail's own
writer, then toolkeeper serves it, pinned to its own core (the client on the
other). Measured, each the median of repeated requests on a kept connection:

- `/healthz`: the floor, an HTTP round trip to the same process;
- the newest page, a page near the oldest (keyset: the same cost), a
  filtered page (approver), and a search in the arguments, in ms and as a
  ratio to the floor;
- `/healthz` while another client pages without pause: how much a page
  rendering slows the proxy's own answers (the reads run in a thread).

Target (issue 15): each page <= 100 ms on this machine; /healthz unaffected.

    python bench/console.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import overhead  # noqa: E402

ROOT = HERE.parent
TOKEN = "bench-console-token"

from toolkeeper.audit import ExecutionRecord, open_audit  # noqa: E402


def seed(path: Path, count: int) -> None:
    audit = open_audit(path)
    audit.connection().execute("PRAGMA synchronous=OFF")  # seeding only
    now = time.time()
    for i in range(count):
        record = ExecutionRecord(tool=("lookup", "release", "publish", "deploy")[i % 4], runner="argv",
                                 call_id=f"c{i}", request_id=f"r{i // 3}", time=now - count + i, agent="a1b2",
                                 arguments={"word": f"w{i}"}, argv=["x", f"w{i}"], decision="allow",
                                 decision_source="yolo", status="ok", duration_ms=4.0,
                                 approver="ada" if i % 13 == 0 else None)
        audit.decided(record)
        audit.completed(record)
    audit.close()


async def timed(session: aiohttp.ClientSession, url: str, repeat: int) -> float:
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        async with session.get(url) as response:
            await response.read()
            assert response.status == 200, (url, response.status)
        took.append(time.perf_counter() - started)
    return statistics.median(took)


async def healthz_while_paging(root: str, repeat: int) -> float:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    stop = asyncio.Event()

    async def page_without_pause() -> None:
        async with aiohttp.ClientSession(headers=headers) as pager:
            while not stop.is_set():
                async with pager.get(root + "/toolkeeper/audit?search=w1") as response:
                    await response.read()

    pager = asyncio.create_task(page_without_pause())
    await asyncio.sleep(0.2)
    try:
        async with aiohttp.ClientSession() as session:
            return await timed(session, root + "/healthz", repeat)
    finally:
        stop.set()
        await pager


async def run(quick: bool) -> None:
    count, repeat = (2_000, 20) if quick else (20_000, 60)
    workdir = Path(tempfile.mkdtemp(prefix="tk-bench-console-"))
    (workdir / "agent.yaml").write_text("upstream: http://127.0.0.1:9/v1\nyolo: true\ntools:\n"
                                        "  - name: noop\n    description: Do nothing.\n    command: [/bin/true]\n")
    started = time.perf_counter()
    seed(workdir / "audit.sqlite3", count)
    print(f"a trail of {count} calls ({2 * count} events), written in {time.perf_counter() - started:.1f} s")
    port = overhead.free_port()
    server = subprocess.Popen([sys.executable, "-m", "toolkeeper", "serve", str(workdir / "agent.yaml"), "--port",
                               str(port), "--log-level", "ERROR", "--audit", str(workdir / "audit.sqlite3")],
                              cwd=ROOT, stdout=subprocess.DEVNULL, env={**os.environ, "TOOLKEEPER_ADMIN_TOKEN": TOKEN})
    root = f"http://127.0.0.1:{port}"
    try:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:
            os.sched_setaffinity(server.pid, {cores[-1]})
            os.sched_setaffinity(0, set(cores[:-1]))
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
            for _ in range(100):
                try:
                    await timed(session, root + "/healthz", 1)
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            floor = await timed(session, root + "/healthz", repeat)
            cases = {"newest page": "/toolkeeper/audit", "a page near the oldest": "/toolkeeper/audit?before=300",
                     "filtered (approver)": "/toolkeeper/audit?approver=ada",
                     "search in arguments": "/toolkeeper/audit?search=w1999",
                     "one call in full": None, "charts, 24 h": "/toolkeeper/audit/charts?range=24h"}
            listing = await (await session.get(root + "/toolkeeper/audit")).text()
            cases["one call in full"] = "/toolkeeper/audit/" + listing.split(
                "<tr class=record><td><a href='/toolkeeper/audit/", 1)[1].split("'", 1)[0]
            print(f"\n{'request':<28}{'median ms':>10}{'x /healthz':>12}")
            print(f"{'/healthz (the floor)':<28}{floor * 1e3:>10.2f}{1:>12.1f}")
            for name, path in cases.items():
                took = await timed(session, root + path, repeat)
                print(f"{name:<28}{took * 1e3:>10.2f}{took / floor:>12.1f}")
        busy = await healthz_while_paging(root, repeat)
        print(f"\n/healthz while another client pages without pause: {busy * 1e3:.2f} ms, "
              f"{busy / floor:.1f}x the idle floor")
    finally:
        server.terminate()
        server.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    asyncio.run(run(parser.parse_args().quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
