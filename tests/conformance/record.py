"""Re-record the golden transcripts: python tests/conformance/record.py

Run it after a deliberate change to what toolkeeper sends, then read the diff
of golden/ before committing it: that diff is the change agents will see.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import messages_cases  # noqa: E402
import responses_cases  # noqa: E402
from cases import cases, golden_path, run_case  # noqa: E402
from conftest import STANDARD_AGENT, Process, Scripted, start_toolkeeper, write_agent  # noqa: E402


def main() -> None:
    scripted_process = Process([sys.executable, "-m", "toolkeeper.scripted", "--port", "0"], "listening on")
    scripted = Scripted(scripted_process)
    directory = Path(tempfile.mkdtemp(prefix="tk-conformance-"))
    write_agent(directory, STANDARD_AGENT, pids=str(directory / "pids"))
    toolkeeper = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--keepalive", "60",
                                  "--store", ":memory:")
    try:
        for shape, kind in cases():
            transcript = run_case(shape, kind, toolkeeper.url, scripted)
            golden_path(shape, kind).write_text(json.dumps(transcript, indent=1, ensure_ascii=False) + "\n")
            print(f"recorded {shape}/{kind}")
        for kind in responses_cases.cases():
            transcript = responses_cases.run_case(kind, toolkeeper.url, scripted)
            responses_cases.golden_path(kind).write_text(json.dumps(transcript, indent=1, ensure_ascii=False) + "\n")
            print(f"recorded responses/{kind}")
        for kind in messages_cases.cases():
            transcript = messages_cases.run_case(kind, toolkeeper.url, scripted)
            messages_cases.golden_path(kind).write_text(json.dumps(transcript, indent=1, ensure_ascii=False) + "\n")
            print(f"recorded messages/{kind}")
    finally:
        toolkeeper.stop()
        scripted_process.stop()


if __name__ == "__main__":
    main()
