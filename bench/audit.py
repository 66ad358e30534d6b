"""What the audit trail costs: records per second, and what a record adds to a declared call.

1. In process: write N records as toolkeeper does (a `decided` event before
   the run, a `completed` one after it), to an SQLite file with the
   durability toolkeeper uses (WAL, synchronous=FULL), to the local PostgreSQL
   (its default durability: synchronous_commit=on), and to memory: records per
   second and latency per record.
2. Through toolkeeper: the same declared call (`/bin/true`) with the audit on
   disk and with the audit in memory (no fsync), p50 of each, in the same run.

Target (issue 5): the record adds <= 0.5 ms to a call on SQLite.

    python bench/audit.py [--quick]
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

from toolkeeper.audit import ExecutionRecord, open_audit  # noqa: E402

POSTGRES = "postgresql://127.0.0.1:5432/test"


def postgres_records(count: int) -> tuple[float, float, float] | None:
    """The same in a scratch schema of the local PostgreSQL; None when it does not run."""
    import psycopg

    schema = f"tk_bench_{int(time.time())}"
    try:
        admin = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=3)
    except psycopg.Error:
        return None
    with admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            return write_records(f"{POSTGRES}?options=-csearch_path%3D{schema}", count)
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def write_records(path: str, count: int) -> tuple[float, float, float]:
    audit = open_audit(path)
    times = []
    started = time.perf_counter()
    for i in range(count):
        record = ExecutionRecord(tool="release", runner="argv", call_id=f"c{i}", status="ok",
                                 arguments={"version": "1.4.2", "channel": "beta"},
                                 argv=["./release.sh", "1.4.2", "--channel=beta"], decision="allow",
                                 decision_source="yolo", policy_input={"tool": {"name": "release"}})
        one = time.perf_counter()
        audit.decided(record)
        audit.completed(record)
        times.append(time.perf_counter() - one)
    elapsed = time.perf_counter() - started
    intact, _ = audit.verify()
    audit.close()
    assert intact
    times.sort()
    return count / elapsed, statistics.median(times), times[int(len(times) * 0.99) - 1]


async def through_toolkeeper(samples: int) -> tuple[float, float]:
    workdir = Path(tempfile.mkdtemp(prefix="tk-bench-audit-"))
    (workdir / "agent.yaml").write_text("upstream: http://127.0.0.1:9/v1\nyolo: true\ntools:\n"
                                        "  - name: noop\n    description: Do nothing.\n    command: [/bin/true]\n")
    mock_port, disk_port, memory_port = overhead.free_port(), overhead.free_port(), overhead.free_port()
    mock_url = f"http://127.0.0.1:{mock_port}/v1"

    def toolkeeper(port: int, audit: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "toolkeeper", "serve", str(workdir / "agent.yaml"), "--port",
                                 str(port), "--upstream", mock_url, "--log-level", "WARNING", "--store", ":memory:",
                                 "--audit", audit], cwd=ROOT, stdout=subprocess.DEVNULL)

    processes = [subprocess.Popen([sys.executable, str(HERE / "overhead.py"), "--serve-mock", str(mock_port)]),
                 toolkeeper(disk_port, str(workdir / "audit.sqlite3")), toolkeeper(memory_port, ":memory:")]
    try:
        urls = [f"http://127.0.0.1:{port}/v1" for port in (mock_port, disk_port, memory_port)]
        for url in urls:
            await overhead.wait_ready(url)
        body = {"model": "b", "messages": [{"role": "user", "content": "call"}]}
        disk = (await overhead.measure(urls[1], body, 1, samples, None))["p50"]
        memory = (await overhead.measure(urls[2], body, 1, samples, None))["p50"]
        return disk, memory
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    count = 200 if quick else 2000
    with tempfile.TemporaryDirectory() as directory:
        disk = write_records(str(Path(directory) / "audit.sqlite3"), count)
    memory = write_records(":memory:", count)
    postgres = postgres_records(count)
    print(f"audit records (decided + completed), {count} each\n")
    print(f"{'store':<40}{'records/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    rows = [("SQLite file, WAL, synchronous=FULL", disk), ("PostgreSQL 127.0.0.1, synchronous_commit=on", postgres),
            ("SQLite in memory (no durability)", memory)]
    for name, figures in rows:
        if figures is None:
            print(f"{name:<40}{'(not running)':>28}")
        else:
            print(f"{name:<40}{figures[0]:>10.0f}{figures[1] * 1e3:>9.3f}{figures[2] * 1e3:>9.3f}")
    on_disk, in_memory = asyncio.run(through_toolkeeper(150 if quick else 1000))
    print(f"\na declared call (/bin/true) through toolkeeper, p50: audit on disk {on_disk * 1e3:.3f} ms, "
          f"in memory {in_memory * 1e3:.3f} ms: the durable record adds {(on_disk - in_memory) * 1e3:.3f} ms")
    print(f"(the record's own cost per call, decided + completed, on disk: {disk[1] * 1e3:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
