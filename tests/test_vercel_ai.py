"""The Vercel AI SDK's default OpenAI provider (the Responses API, history sent back as `item_reference`s)
through toolkeeper: `node tests/clients/vercel_ai.mjs`, installed by scripts/test in `.npm/`."""

from __future__ import annotations

import json
import shutil
import subprocess

from conftest import ROOT, call

NODE_MODULES = ROOT / ".npm" / "node_modules"


def test_vercel_ai_sdk_runs_a_declared_tool_and_its_own(scripted, tk):
    assert (NODE_MODULES / "ai").exists(), "the AI SDK is missing: bash scripts/test installs it (npm)"
    scripted.script({"tool_calls": [call("lookup", {"word": "fjord"}, "call_dec"),
                                    call("get_weather", {"city": "Bergen"}, "call_own")]},
                    {"content": "A fjord is a sea inlet; Bergen is sunny."},
                    {"content": "You are welcome."})
    # an ES module finds its packages from where it lies: beside .npm/node_modules
    script = NODE_MODULES.parent / "vercel_ai.mjs"
    shutil.copy(ROOT / "tests" / "clients" / "vercel_ai.mjs", script)
    run = subprocess.run(["node", str(script), tk.base_url], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["first"] == "A fjord is a sea inlet; Bergen is sunny." and seen["second"] == "You are welcome."
    assert seen["weatherCalls"] == ["Bergen"] and tk.calls() == [["lookup", "fjord"]]
    assert "lookup" not in json.dumps(seen["steps"])
    sent = scripted.bodies()[-1]["input"]  # the second turn: references resolved, the hidden exchange back
    assert [item.get("call_id") for item in sent if item.get("type") == "function_call"] == ["call_dec",
                                                                                              "call_own"]
