"""Discoverable tools: found through search_tools, capped at 3 searches a turn."""

from __future__ import annotations

import pytest
from conftest import call, fresh, serving, user, write_agent

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
      - name: lookup
        description: Look a word up in the dictionary. Returns its definition.
        parameters:
          word: {type: string, description: "The word."}
        command: ["{python}", "{tools}/record.py", "lookup", "{{word}}"]
        env: {OUT: "{out}"}
      - name: export_table
        description: Write a table to a file. Returns the file's path.
        parameters:
          table: {type: string, description: "The table name."}
        command: ["{python}", "{tools}/record.py", "export_table", "{{table}}"]
        env: {OUT: "{out}"}
        visibility: discoverable
        keywords: [csv, spreadsheet, download]
      - name: index_stats
        description: Show the statistics of a database index.
        parameters:
          index: {type: string, description: "The index name."}
        command: ["{python}", "{tools}/record.py", "index_stats", "{{index}}"]
        env: {OUT: "{out}"}
        visibility: discoverable
"""


@pytest.fixture(scope="module")
def tk_discover(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("discover")
    write_agent(directory, AGENT)
    with serving(scripted, directory) as running:
        yield running


@pytest.fixture
def tkd(tk_discover):
    yield from fresh(tk_discover)


def names(body: dict) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def results(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def test_search_finds_a_tool_that_is_callable_in_the_next_round(scripted, tkd):
    scripted.script(
        {"tool_calls": [call("search_tools", {"query": "export as csv"})]},
        {"tool_calls": [call("export_table", {"table": "orders"})]},
        {"content": "Exported."},
    )
    answer = tkd.client().chat.completions.create(model="m", messages=user())
    first, second, _ = scripted.bodies()
    assert names(first) == ["lookup", "search_tools"]
    assert names(second) == ["lookup", "export_table", "search_tools"]
    assert results(second)[0].startswith("Found 1 tool; you can call them now:\n- export_table(table): Write a table")
    assert tkd.calls() == [["export_table", "orders"]]
    assert answer.choices[0].message.content == "Exported."
    assert "search_tools" not in answer.model_dump_json()


def test_a_tool_not_found_yet_is_answered_with_the_search_to_make(scripted, tkd):
    scripted.script({"tool_calls": [call("index_stats", {"index": "pk"})]}, {"content": "ok"})
    tkd.client().chat.completions.create(model="m", messages=user())
    assert tkd.calls() == []
    assert results(scripted.bodies()[1])[0] == (
        "Tool 'index_stats' is not in your active set. Call search_tools(query='index_stats') to discover it, "
        "or use one of: lookup.")


def test_searches_are_capped_at_three_a_turn(scripted, tkd):
    scripted.script(*[{"tool_calls": [call("search_tools", {"query": f"zebra {i}"})]} for i in range(4)],
                    {"content": "gave up"})
    tkd.client().chat.completions.create(model="m", messages=user())
    last = results(scripted.bodies()[4])
    assert last[0].startswith("No tool matches 'zebra 0'. Try other words, or use one of the tools you have: lookup.")
    assert last[3].startswith('{"error": "search-budget-exhausted", "budgetCap": 3}')


def test_a_tool_found_in_an_earlier_turn_is_offered_at_once(scripted, tkd):
    history = [
        *user(),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "export_table", "arguments": '{"table":"x"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "ran"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Again with y."},
    ]
    scripted.script({"tool_calls": [call("export_table", {"table": "y"})]}, {"content": "ok"})
    tkd.client().chat.completions.create(model="m", messages=history)
    assert "export_table" in names(scripted.bodies()[0])
    assert tkd.calls() == [["export_table", "y"]]


def test_discovery_over_the_responses_api(scripted, tkd):
    """The same search, budget and offer when the agent speaks the Responses API."""
    scripted.script({"tool_calls": [call("search_tools", {"query": "export a table as csv"})]},
                    {"tool_calls": [call("export_table", {"table": "users"})]},
                    {"content": "Exported."})
    response = tkd.client().responses.create(model="m", input=user()[0]["content"])
    assert response.output_text == "Exported."
    assert [item.type for item in response.output] == ["message"]
    first, second, _ = scripted.bodies()
    offered = [[t["name"] for t in body["tools"]] for body in (first, second)]
    assert "export_table" not in offered[0] and "search_tools" in offered[0]
    assert "export_table" in offered[1]  # found, and offered from the very next round
    assert tkd.calls() == [["export_table", "users"]]
