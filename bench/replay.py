"""How long `toolkeeper policy replay` takes over a large trail, against reading the same trail, in one run.

A trail of N calls (default 20,000: the agent's Bash and Read calls and an
MCP tool's, tests/trails.py) is written through toolkeeper's own audit trail,
each call decided by a small rules file as serve would. Then, in rounds:

- the floor: `toolkeeper audit verify` walks the same chain (replay verifies
  it first, so replay can never be cheaper);
- replay: `toolkeeper policy replay --candidate` with rules that parse every
  Bash command (`runs:`) and resolve every Read path (`under:`), plus a shadow
  rule, verifying the chain and deciding every call again.

Both are whole commands (Python's start included), as an operator runs them.
The script prints the median of each and their ratio; issue 26's target is
20,000 calls in under 10 s on this machine.

    python bench/replay.py            # 20,000 calls, 3 rounds
    python bench/replay.py --quick    # 2,000 calls, 1 round
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from trails import CANDIDATE_RULES, CURRENT_RULES, seed  # noqa: E402  (the tests' seeding, so bench and test replay the same trail)


def timed(*args: str) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "toolkeeper", *args], capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"toolkeeper {' '.join(args)} failed: {done.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2,000 calls, one round: a smoke run")
    args = parser.parse_args()
    calls, rounds = (2000, 1) if args.quick else (args.calls, args.rounds)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "current.yaml").write_text(CURRENT_RULES)
        (folder / "candidate.yaml").write_text(CANDIDATE_RULES)
        started = time.monotonic()
        seed(folder / "trail.sqlite3", calls, folder / "current.yaml")
        print(f"seeded {calls} calls in {time.monotonic() - started:.1f} s")
        trail = str(folder / "trail.sqlite3")
        verify, replay = [], []
        for _ in range(rounds):
            verify.append(timed("audit", "verify", "--db", trail))
            replay.append(timed("policy", "replay", "--candidate", str(folder / "candidate.yaml"), "--db", trail))
    floor, took = statistics.median(verify), statistics.median(replay)
    print(f"audit verify (the floor): {floor:.2f} s   policy replay: {took:.2f} s   ratio {took / floor:.2f}x")
    print(f"replay: {took / calls * 1e6:.0f} us per call; {calls} calls in {took:.2f} s (target: 20,000 in < 10 s)")


if __name__ == "__main__":
    main()
