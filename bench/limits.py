"""What a limit check costs a call: its reservation in the store, and a limited call end to end, on PostgreSQL.

Measured in one run:

- in this process, a limit's reservation (`store.take`: lock the scope's row, add to its bucket if the window
  leaves room, read the sum, in one transaction), against the floor of one statement on the same pool
  (`SELECT 1`), on PostgreSQL (127.0.0.1:5432) and SQLite, p50/p99 µs; and the same reservation made by 32 calls
  at once on one scope (they take turns on its row: the p99 is the queue);
- end to end on PostgreSQL, a request whose answer holds one call of the agent's own `Bash`, through toolkeeper
  with a limit that selects it (calls per user per hour) against the same toolkeeper with no limit (one plain rule:
  the call decided all the same), and the model server directly, interleaved; p50/p99 and the ratios.

    python bench/limits.py            # 5 rounds of 300 requests
    python bench/limits.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import flows  # noqa: E402 - its model server (one Bash call) and request loop

ROOT = HERE.parent
POSTGRES = flows.POSTGRES
RULES = {"plain": "rules:\n  - {id: no-rm, effect: deny, reason: deleting is not allowed, when: {tool: Bash, "
                  "arguments: {command: {runs: {program: rm}}}}}\n",
         "limited": "limits:\n  - {id: bash-per-user, when: {tool: Bash}, max: 100000000, per: 1h, scope: user}\n"
                    "rules:\n  - {id: no-rm, effect: deny, reason: deleting is not allowed, when: {tool: Bash, "
                    "arguments: {command: {runs: {program: rm}}}}}\n"}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def store_costs(location: str, count: int) -> dict[str, list[float]]:
    """Seconds of each floor statement, each reservation, and each reservation of 32 made at once."""
    from toolkeeper.store import Count, open_store

    store = open_store(location)
    scope = Count("bench", f"user=bench-{time.time_ns()}", 3600, 10**9)
    found: dict[str, list[float]] = {"floor": [], "take": [], "take, 32 at once": []}
    try:
        await store.take([scope])  # the pool open and the row there
        for _ in range(count):
            started = time.perf_counter()
            await store.check()
            found["floor"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await store.take([scope])
            found["take"].append(time.perf_counter() - started)

        async def timed() -> float:
            started = time.perf_counter()
            await store.take([scope])
            return time.perf_counter() - started

        for _ in range(max(1, count // 32)):
            found["take, 32 at once"] += await asyncio.gather(*(timed() for _ in range(32)))
    finally:
        await store.close()
    return found


async def end_to_end(quick: bool) -> None:
    names = {"direct": "direct", "plain": "toolkeeper, no limit", "limited": "toolkeeper, a limit on Bash"}
    results = await flows.measured(quick, RULES, names, "each answered with one Bash call; store on PostgreSQL",
                                   POSTGRES)
    for q, said in ((0.5, "p50"), (0.99, "p99")):
        added = (quantile(results["limited"], q) - quantile(results["plain"], q)) * 1e6
        print(f"the limit check adds {added:.0f} µs at {said} to a governed call")


async def run(quick: bool) -> None:
    count = 320 if quick else 3200
    print(f"{'store':<12}{'operation':<20}{'p50 µs':>9}{'p99 µs':>9}{'p50 / floor':>13}")
    with tempfile.TemporaryDirectory() as folder:
        locations = {"SQLite": str(Path(folder) / "store.sqlite3"), "PostgreSQL": POSTGRES}
        for name, location in locations.items():
            try:
                found = await store_costs(location, count)
            except Exception as exc:  # no server here: the other figures stand alone
                print(f"{name}: not measured ({type(exc).__name__}: {str(exc)[:100]})")
                continue
            floor = statistics.median(found["floor"])
            for operation, values in found.items():
                print(f"{name:<12}{operation:<20}{quantile(values, 0.5) * 1e6:>9.0f}"
                      f"{quantile(values, 0.99) * 1e6:>9.0f}{statistics.median(values) / floor:>13.2f}")
    await end_to_end(quick)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    asyncio.run(run(parser.parse_args().quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
