"""WebAssembly tools: typed like any declared tool, confined to what their entry grants,
and stopped (never the proxy) when they spin, bloat, crash or flood."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest
from conftest import ROOT, call, fresh, serving, user, write_agent

from toolkeeper.tools import AgentFileError, load_agent_file

WASM = ROOT / "tests" / "wasm"
EXAMPLE = ROOT / "declared" / "example" / "wasm"

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
      - name: show
        description: Show the argv and environment the module gets.
        parameters:
          text: {type: string, description: "Some text."}
          n: {type: integer, required: false, description: "A number."}
        wasm: {wasm}/show.wat
        command: ["show", "{{text}}", "--n={{n}}"]
        env: {LANG: C}
      - name: count_words
        description: Count the words of a text.
        parameters:
          text: {type: string, description: "The text."}
        wasm: {example}/word_count.wat
        command: ["word_count", "{{text}}"]
      - name: read_data
        description: Read a file of the data mount.
        parameters:
          path: {type: string, description: "The path."}
        wasm: {example}/notes.wat
        command: ["notes", "read", "{{path}}"]
        mounts: {/data: {path: data}}
      - name: write_readonly
        description: Write a file to the read-only data mount.
        parameters:
          path: {type: string, description: "The path."}
        wasm: {example}/notes.wat
        command: ["notes", "write", "{{path}}"]
        mounts: {/data: {path: data, writable: false}}
      - name: write_scratch
        description: Write a file to the writable scratch mount.
        parameters:
          path: {type: string, description: "The path."}
        wasm: {example}/notes.wat
        command: ["notes", "write", "{{path}}"]
        mounts: {/scratch: {path: scratch, writable: true}}
      - name: spin
        description: Spin until stopped by time.
        wasm: {wasm}/spin.wat
        command: ["spin"]
        timeout: 0.5
      - name: spin_fuel
        description: Spin until out of fuel.
        wasm: {wasm}/spin.wat
        command: ["spin"]
        fuel: 1000000
        timeout: 30
      - name: bomb
        description: Eat memory.
        wasm: {wasm}/bomb.wat
        command: ["bomb"]
        memory: 8
        timeout: 10
      - name: crash
        description: Crash.
        wasm: {wasm}/crash.wat
        command: ["crash"]
      - name: exit3
        description: Fail with exit status 3.
        wasm: {wasm}/exit3.wat
        command: ["exit3"]
      - name: sleep
        description: Sleep a minute on the host.
        wasm: {wasm}/sleep.wat
        command: ["sleep"]
        timeout: 1
      - name: symlink
        description: Try to link out of its writable mount.
        wasm: {wasm}/symlink.wat
        command: ["symlink"]
        mounts: {/data: {path: scratch, writable: true}}
      - name: flood
        description: Print 10 MiB.
        wasm: {wasm}/flood.wat
        command: ["flood"]
        max_output: 4096
"""


@pytest.fixture(scope="module")
def wasm_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wasm")
    (directory / "data").mkdir()
    (directory / "scratch").mkdir()
    (directory / "data" / "hello.txt").write_text("hello from the mount\n")
    (directory / "secret.txt").write_text("TOP SECRET outside the mount\n")
    (directory / "data" / "escape").symlink_to(directory / "secret.txt")
    (directory / "data" / "up").symlink_to("../secret.txt")
    write_agent(directory, AGENT, wasm=str(WASM), example=str(EXAMPLE))
    return directory


@pytest.fixture(scope="module")
def tk_wasm_server(scripted, wasm_dir):
    with serving(scripted, wasm_dir) as running:
        yield running


@pytest.fixture
def tkw(tk_wasm_server):
    yield from fresh(tk_wasm_server)


def run_tool(scripted, tk, name: str, arguments: dict) -> str:
    """Have the model call one tool, and return what the tool answered."""
    scripted.script({"tool_calls": [call(name, arguments)]}, {"content": "{tool_result}"})
    return tk.client().chat.completions.create(model="m", messages=user()).choices[0].message.content


def test_a_wasm_tool_through_the_proxy(scripted, tkw):
    assert run_tool(scripted, tkw, "count_words", {"text": "the quick  brown\nfox"}) == "4"
    tool = next(t for t in scripted.bodies()[0]["tools"] if t["function"]["name"] == "count_words")
    assert tool["function"]["parameters"]["properties"]["text"]["type"] == "string"


def test_the_module_sees_its_argv_and_only_the_variables_given(scripted, tkw):
    answer = run_tool(scripted, tkw, "show", {"text": "a b; rm -rf ~ $(id)", "n": "3"})
    assert answer.split("\n") == ["show", "a b; rm -rf ~ $(id)", "--n=3", "--", "LANG=C"]
    assert run_tool(scripted, tkw, "show", {"text": "x"}).split("\n") == ["show", "x", "--", "LANG=C"]


def test_reads_inside_its_mount(scripted, tkw):
    assert run_tool(scripted, tkw, "read_data", {"path": "hello.txt"}) == "hello from the mount"


@pytest.mark.parametrize("path", ["../secret.txt", "escape", "up", "/etc/passwd", "../../../../etc/passwd"])
def test_nothing_outside_its_mount_is_found(scripted, tkw, path):
    answer = run_tool(scripted, tkw, "read_data", {"path": path})
    assert answer.startswith("The module failed with exit status 1.")
    assert "cannot open it: WASI error" in answer
    assert "SECRET" not in answer and "root:" not in answer


def test_a_read_only_mount_refuses_writes(scripted, tkw, wasm_dir):
    answer = run_tool(scripted, tkw, "write_readonly", {"path": "new.txt"})
    assert answer.startswith("The module failed with exit status 1.")
    assert not (wasm_dir / "data" / "new.txt").exists()
    assert (wasm_dir / "data" / "hello.txt").read_text() == "hello from the mount\n"


def test_a_writable_mount_takes_writes(scripted, tkw, wasm_dir):
    assert run_tool(scripted, tkw, "write_scratch", {"path": "out.txt"}).startswith("(the module succeeded")
    assert (wasm_dir / "scratch" / "out.txt").read_text() == "written by a wasm tool\n"


def test_an_endless_loop_is_stopped_by_time_and_the_proxy_stays_responsive(scripted, tkw):
    scripted.script({"when": "spin", "tool_calls": [call("spin", {})]}, {"when": "spin", "content": "{tool_result}"},
                    {"when": "quick", "tool_calls": [call("count_words", {"text": "still here"})]},
                    {"when": "quick", "content": "{tool_result}"})
    results = {}

    def ask(word: str) -> None:
        answer = tkw.client().chat.completions.create(model="m", messages=[{"role": "user", "content": word}])
        results[word] = (answer.choices[0].message.content, time.monotonic() - started)

    started = time.monotonic()
    spinning = threading.Thread(target=ask, args=("spin",))
    spinning.start()
    time.sleep(0.1)  # the module is spinning now
    ask("quick")
    spinning.join(10)
    assert results["quick"][0] == "2"
    # answered while the module still spun (the machine's load sets the times; the order is what matters)
    assert results["quick"][1] < results["spin"][1], "a spinning module held up another call"
    assert results["spin"][0] == "The module timed out after 0.5 s and was stopped."
    assert 0.5 <= results["spin"][1] < 3


def test_an_endless_loop_is_stopped_by_fuel(scripted, tkw):
    assert run_tool(scripted, tkw, "spin_fuel", {}) == (
        "The module was stopped: it ran out of fuel: its budget of 1,000,000 instructions was used up.")


def test_a_memory_bomb_is_stopped_at_its_limit(scripted, tkw):
    assert run_tool(scripted, tkw, "bomb", {}) == (
        "The module was stopped: it accessed memory outside its bounds (its memory: 7.1 MiB of its 8 MiB limit).")


def test_a_trap_is_reported_in_words(scripted, tkw):
    assert run_tool(scripted, tkw, "crash", {}) == (
        "The module was stopped: it reached an `unreachable` instruction (the module crashed on purpose, "
        "as a panic or abort does).")


def test_a_non_zero_exit_reports_its_status_and_streams(scripted, tkw):
    assert run_tool(scripted, tkw, "exit3", {}) == (
        "The module failed with exit status 3.\nstdout:\npartial output\n\nstderr:\nerror: bad input")


def test_a_huge_output_is_cut(scripted, tkw):
    answer = run_tool(scripted, tkw, "flood", {})
    assert answer.startswith("BEGIN\n") and answer.endswith("END")
    assert "bytes cut by toolkeeper; 10,485,770 bytes in all" in answer


def test_records_carry_the_runner_argv_and_trap(scripted, wasm_dir):
    """In process, to read the records an observer gets (the audit trail's input)."""
    from aiohttp import web
    from openai import AsyncOpenAI

    from toolkeeper.app import build_app
    from toolkeeper.settings import Settings

    records = []
    agent = load_agent_file(wasm_dir / "agent.yaml", upstream=scripted.base_url)

    async def run() -> None:
        runner = web.AppRunner(build_app(agent, Settings(store=":memory:"), observers=[records.append]))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0) as client:
                scripted.script({"tool_calls": [call("count_words", {"text": "a b"}), call("crash", {})]},
                                {"content": "done"})
                await client.chat.completions.create(model="m", messages=user())
        finally:
            await runner.cleanup()

    asyncio.run(run())
    ok, crashed = sorted(records, key=lambda record: record.tool != "count_words")  # they ran at once
    assert (ok.runner, ok.status, ok.exit_code, ok.argv, ok.trap) == ("wasm", "ok", 0, ["word_count", "a b"], None)
    assert ok.output_bytes == 2
    assert (crashed.runner, crashed.status, crashed.exit_code) == ("wasm", "failed", None)
    assert crashed.trap.startswith("it reached an `unreachable` instruction")


def test_a_changed_module_is_compiled_again(tmp_path):
    from toolkeeper.tools import compiled_modules

    module = tmp_path / "tool.wat"
    shutil.copy(EXAMPLE / "word_count.wat", module)
    modules = compiled_modules()
    first = modules.module(module)
    assert modules.module(module) is first  # cached
    shutil.copy(WASM / "show.wat", module)
    assert modules.module(module) is not first


@pytest.mark.parametrize(("entry", "expected"), [
    ("wasm: missing.wat|command: [m]", "key 'wasm': "),
    ("wasm: {wasm}/../conftest.py|command: [m]", "key 'wasm': "),
    ("wasm: nostart.wat|command: [m]", "exports no `_start`"),
    ("wasm: {wasm}/spin.wat|command: [m]|mounts: {/d: {path: nowhere}}", "key 'mounts./d.path'"),
    ("wasm: {wasm}/spin.wat|command: [m]|mounts: {d: {path: .}}", "must be absolute"),
    ("wasm: {wasm}/spin.wat|command: [m]|workdir: .", "key 'workdir'"),
    ("command: [/bin/true]|memory: 8", "key 'memory': applies to wasm tools only"),
    ('wasm: {wasm}/spin.wat|command: ["{{x}}"]', "cannot come from a placeholder"),
])
def test_broken_wasm_entries_are_load_errors(tmp_path, entry, expected):
    (tmp_path / "nostart.wat").write_text('(module (func (export "main")))')
    lines = ["tools:", "  - name: t", "    description: A tool.", "    parameters:",
             '      x: {type: string, required: false, description: "x"}']
    lines += [f"    {line}" for line in entry.split("|")]
    path = write_agent(tmp_path, "\n".join(lines) + "\n", wasm=str(WASM))
    with pytest.raises(AgentFileError) as caught:
        load_agent_file(path)
    assert expected in str(caught.value)


def test_the_time_limit_holds_while_a_module_sleeps_on_the_host(scripted, tkw):
    started = time.monotonic()
    answer = run_tool(scripted, tkw, "sleep", {})
    took = time.monotonic() - started
    assert answer.startswith("The module timed out after 1 s") and "woke" not in answer
    assert took < 4, took


def test_sleeping_modules_do_not_starve_the_others(scripted, tkw):
    """Four modules asleep on the host, then a trivial one: it answers at once."""
    scripted.script(*[{"when": f"sleeper {i}", "tool_calls": [call("sleep", {})]} for i in range(4)],
                    *[{"when": f"sleeper {i}", "content": "slept"} for i in range(4)])
    sleepers = [threading.Thread(target=lambda i=i: tkw.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"sleeper {i}"}])) for i in range(4)]
    for thread in sleepers:
        thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    scripted.add({"when": "quick", "tool_calls": [call("count_words", {"text": "a b c"})]},
                 {"when": "quick", "content": "{tool_result}"})
    answer = tkw.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "quick"}])
    took = time.monotonic() - started
    for thread in sleepers:
        thread.join()
    assert answer.choices[0].message.content == "3"
    assert took < 0.9, took  # before any sleeper's 1 s limit ran out


def test_a_module_cannot_create_a_symlink_out_of_its_mount(scripted, tkw, wasm_dir):
    answer = run_tool(scripted, tkw, "symlink", {})
    assert answer.startswith("The module failed with exit status 63")  # WASI's EPERM
    assert not (wasm_dir / "scratch" / "escape").is_symlink()
