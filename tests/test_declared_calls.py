"""Declared calls through a real toolkeeper, driven by the real openai client."""

from __future__ import annotations

import asyncio
import json
import time

from conftest import call, user


def test_declared_call_runs_with_exact_argv_and_leaves_no_trace(scripted, tk):
    scripted.script(
        {"content": "Releasing.", "tool_calls": [call("release", {"version": "1.4.2", "channel": "beta"})]},
        {"content": "Released: {tool_result}"},
    )
    answer = tk.client().chat.completions.create(model="m", messages=user())

    assert tk.calls() == [["release", "1.4.2", "--channel=beta"]]  # the absent optional --notes entry dropped
    message = answer.choices[0].message
    assert message.tool_calls is None
    assert answer.choices[0].finish_reason == "stop"
    assert message.content == 'Releasing.Released: ran ["release", "1.4.2", "--channel=beta"]'
    dumped = answer.model_dump_json()
    assert "call_" not in dumped and '"release"' not in dumped.replace('\\"release\\"', "")

    # the model got the declared schema, then its own call and the result back
    first, second = scripted.bodies()
    assert [t["function"]["name"] for t in first["tools"]][:3] == ["release", "count", "lookup"]
    assistant, result = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "release"
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                      "content": 'ran ["release", "1.4.2", "--channel=beta"]\n'}


def test_streamed_answer_reassembles_to_the_non_streamed_one(scripted, tk):
    steps = (
        {"content": "Let me check. ", "tool_calls": [call("lookup", {"word": "ångström"})]},
        {"content": "It is a unit of length: {tool_result}"},
    )
    scripted.script(*steps)
    whole = tk.client().chat.completions.create(model="m", messages=user())
    scripted.script(*steps)
    with tk.client().chat.completions.stream(model="m", messages=user()) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion()
    assert streamed.choices[0].message.content == whole.choices[0].message.content
    assert streamed.choices[0].message.tool_calls in (None, [])
    assert streamed.choices[0].finish_reason == whole.choices[0].finish_reason == "stop"
    assert tk.calls() == [["lookup", "ångström"], ["lookup", "ångström"]]


def test_stream_has_one_id_role_once_and_one_done(scripted, tk):
    scripted.script(
        {"content": "First. ", "tool_calls": [call("lookup", {"word": "a"})]},
        {"content": "Second. ", "tool_calls": [call("lookup", {"word": "b"})]},
        {"content": "Answer."},
    )
    chunks = list(tk.client().chat.completions.create(model="m", messages=user(), stream=True))
    assert len({chunk.id for chunk in chunks}) == 1
    assert len({chunk.created for chunk in chunks}) == 1
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "First. Second. Answer."


def test_two_rounds_then_the_answer(scripted, tk):
    scripted.script(
        {"tool_calls": [call("lookup", {"word": "alpha"})]},
        {"tool_calls": [call("release", {"version": "2.0.0", "channel": "stable"})]},
        {"content": "Both done."},
    )
    answer = tk.client().chat.completions.create(model="m", messages=user())
    assert answer.choices[0].message.content == "Both done."
    assert tk.calls() == [["lookup", "alpha"], ["release", "2.0.0", "--channel=stable"]]
    third = scripted.bodies()[2]["messages"]
    assert [m["role"] for m in third] == ["user", "assistant", "tool", "assistant", "tool"]


def test_round_cap_ends_the_turn_cleanly(scripted, tk):
    scripted.script(*[{"tool_calls": [call("lookup", {"word": f"w{i}"})]} for i in range(16)])
    answer = tk.client().chat.completions.create(model="m", messages=user())
    assert len(scripted.bodies()) == 16
    assert len(tk.calls()) == 16
    assert answer.choices[0].finish_reason == "stop"
    assert "16 rounds" in answer.choices[0].message.content
    assert answer.choices[0].message.tool_calls is None


def test_shell_syntax_arrives_as_one_argv_entry(scripted, tk, tmp_path):
    marker = tmp_path / "pwned"
    evil = f"1.4.2; touch {marker}"
    subst = f"$(touch {marker})"
    scripted.script(
        {"tool_calls": [call("release", {"version": evil, "channel": "beta", "notes": subst}),
                        call("lookup", {"word": f"`touch {marker}` && rm -rf ~"})]},
        {"content": "ok"},
    )
    tk.client().chat.completions.create(model="m", messages=user())
    assert sorted(tk.calls()) == [  # the two ran at once: in either order
        ["lookup", f"`touch {marker}` && rm -rf ~"],
        ["release", evil, "--channel=beta", f"--notes={subst}"],
    ]
    assert not marker.exists()


def test_lenient_coercion_accepts_what_needs_no_guess(scripted, tk):
    scripted.script(
        {"tool_calls": [call("count", {"n": "3", "ratio": "2.5", "flag": "true", "items": ["a", "b c"]})]},
        {"content": "ok"},
    )
    tk.client().chat.completions.create(model="m", messages=user())
    assert tk.calls() == [["count", "3", "--ratio=2.5", "--flag=true", "a", "b c"]]


def _tool_results(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def test_invalid_calls_are_answered_and_the_retry_succeeds(scripted, tk):
    bad = [
        ({"n": "three"}, "n must be a whole number"),
        ({"n": 1, "flag": "yes"}, "flag must be true or false"),
        ({"n": 1, "colour": "red"}, "colour is not a parameter of count"),
        ({"ratio": 1.5}, "n is missing; it is required"),
    ]
    for arguments, expected in bad:
        scripted.script(
            {"tool_calls": [call("count", arguments)]},
            {"tool_calls": [call("count", {"n": 7})]},
            {"content": "fixed"},
        )
        tk.reset()
        answer = tk.client().chat.completions.create(model="m", messages=user())
        assert answer.choices[0].message.content == "fixed"
        assert tk.calls() == [["count", "7"]], arguments  # only the corrected call ran
        feedback = _tool_results(scripted.bodies()[1])[0]
        assert expected in feedback
        assert "You sent: count(" + json.dumps(arguments, separators=(",", ":")) in feedback
        assert "- n (integer): Required. How many." in feedback
        assert "- flag (boolean): Optional. A flag." in feedback


def test_a_value_outside_enum_names_the_allowed_values(scripted, tk):
    scripted.script(
        {"tool_calls": [call("release", {"version": "1.0.0", "channel": "nightly"})]},
        {"content": "ok"},
    )
    tk.client().chat.completions.create(model="m", messages=user())
    assert tk.calls() == []
    feedback = _tool_results(scripted.bodies()[1])[0]
    assert 'channel must be one of: stable, beta; got "nightly"' in feedback
    assert "- channel (string): Required. One of: stable, beta." in feedback


def test_packed_call_names_the_missing_field(scripted, tk):
    scripted.script(
        {"tool_calls": [call("release", {"version": "1.4.2 1.4.2, channel beta"})]},
        {"content": "ok"},
    )
    tk.client().chat.completions.create(model="m", messages=user())
    assert tk.calls() == []
    feedback = _tool_results(scripted.bodies()[1])[0]
    assert "channel is missing; it is required" in feedback
    assert "version seems to hold several values (channel too); put each value in its own field" in feedback
    assert "Give each parameter as its own field." in feedback
    assert 'You sent: release({"version":"1.4.2 1.4.2, channel beta"})' in feedback


def test_arguments_that_are_not_json_or_truncated_never_run(scripted, tk):
    scripted.script(
        {"tool_calls": [call("lookup", '{"word": "unfinished')]},
        {"tool_calls": [call("lookup", '{"word": "cut"}')], "finish_reason": "length"},
        {"content": "gave up"},
    )
    answer = tk.client().chat.completions.create(model="m", messages=user())
    assert answer.choices[0].message.content == "gave up"
    assert tk.calls() == []
    bodies = scripted.bodies()
    assert "not valid JSON" in _tool_results(bodies[1])[0]
    assert "cut off (finish_reason: length)" in _tool_results(bodies[2])[1]


def test_loop_detector_stops_the_same_invalid_call(scripted, tk):
    same = {"tool_calls": [call("count", {"n": "many"})]}
    scripted.script(*[same] * 6, {"content": "unreachable"})
    answer = tk.client().chat.completions.create(model="m", messages=user())
    bodies = scripted.bodies()
    assert len(bodies) == 5  # the 5th identical call ends the turn
    results = _tool_results(bodies[4])
    assert "must be a whole number" in results[0] and "must be a whole number" in results[1]
    assert results[2].startswith("Stop: you have called count with these same arguments 3 times")
    assert results[3].startswith("Stop: you have called count with these same arguments 4 times")
    assert answer.choices[0].finish_reason == "stop"
    assert "called count with the same arguments 5 times" in answer.choices[0].message.content
    assert tk.calls() == []


def test_usage_is_summed_and_sent_once_only_when_asked(scripted, tk):
    steps = (
        {"content": "a", "tool_calls": [call("lookup", {"word": "x"})],
         "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110,
                   "completion_tokens_details": {"reasoning_tokens": 3}}},
        {"content": "b", "usage": {"prompt_tokens": 130, "completion_tokens": 20, "total_tokens": 150,
                                   "completion_tokens_details": {"reasoning_tokens": 4}}},
    )
    scripted.script(*steps)
    whole = tk.client().chat.completions.create(model="m", messages=user())
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (230, 30, 260)
    assert whole.usage.completion_tokens_details.reasoning_tokens == 7

    scripted.script(*steps)
    chunks = list(tk.client().chat.completions.create(model="m", messages=user(), stream=True,
                                                      stream_options={"include_usage": True}))
    usages = [c.usage for c in chunks if c.usage]
    assert len(usages) == 1 and usages[0].total_tokens == 260
    assert chunks[-1].usage is not None and chunks[-1].choices == []

    scripted.script(*steps)
    chunks = list(tk.client().chat.completions.create(model="m", messages=user(), stream=True))
    assert not any(c.usage for c in chunks)
    assert "stream_options" not in scripted.bodies()[0]


def test_the_agents_own_tools_and_calls_pass_through(scripted, tk):
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}, "required": ["city"]}}}
    scripted.script({"content": None, "tool_calls": [call("get_weather", '{"city":"Oslo"}', "call_w1")]})
    answer = tk.client().chat.completions.create(model="m", messages=user(), tools=[weather])
    body = scripted.bodies()[0]
    assert body["tools"][0] == weather  # untouched, first
    assert {t["function"]["name"] for t in body["tools"][1:]} >= {"release", "count"}
    calls = answer.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [("call_w1", "get_weather",
                                                                               '{"city":"Oslo"}')]
    assert answer.choices[0].finish_reason == "tool_calls"
    assert tk.calls() == []


def test_an_agent_tool_named_like_a_declared_tool_wins(scripted, tk):
    own = {"type": "function", "function": {"name": "lookup", "description": "The agent's own lookup.",
                                            "parameters": {"type": "object", "properties": {}}}}
    scripted.script({"tool_calls": [call("lookup", {"word": "mine"}, "call_own")]})
    answer = tk.client().chat.completions.create(model="m", messages=user(), tools=[own])
    sent = scripted.bodies()[0]["tools"]
    assert [t for t in sent if t["function"]["name"] == "lookup"] == [own]
    assert answer.choices[0].message.tool_calls[0].id == "call_own"
    assert tk.calls() == []


def test_stdin_json_gets_the_coerced_arguments(scripted, tk):
    scripted.script(
        {"tool_calls": [call("feed", {"doc": {"a": [1, 2], "b": None}, "label": "x"})]},
        {"content": "{tool_result}"},
    )
    answer = tk.client().chat.completions.create(model="m", messages=user())
    assert answer.choices[0].message.content == 'stdin {"doc": {"a": [1, 2], "b": null}, "label": "x"}'


def test_a_failing_tool_reports_exit_status_and_stderr(scripted, tk):
    scripted.script({"tool_calls": [call("fail", {"why": "disk full"})]}, {"content": "{tool_result}"})
    answer = tk.client().chat.completions.create(model="m", messages=user())
    assert answer.choices[0].message.content == (
        "The command failed with exit status 3.\nstdout:\npartial output\n\nstderr:\nerror: disk full")


def test_async_client_streams_too(scripted, tk):
    scripted.script(
        {"content": "Checking... ", "tool_calls": [call("lookup", {"word": "async"})]},
        {"content": "Done."},
    )

    async def run() -> str:
        async with tk.async_client() as client:
            stream = await client.chat.completions.create(model="m", messages=user(), stream=True)
            return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    assert asyncio.run(run()) == "Checking... Done."
    assert tk.calls() == [["lookup", "async"]]


def test_the_declared_calls_of_one_response_run_at_once(scripted, tk):
    """Four one-second tools in one response take about a second, not four; each answers its own call."""
    scripted.script({"tool_calls": [call("nap", {"seconds": 1 + i / 100}, f"n{i}") for i in range(4)]},
                    {"content": "rested"})
    started = time.monotonic()
    answer = tk.client().chat.completions.create(model="m", messages=user())
    took = time.monotonic() - started
    assert answer.choices[0].message.content == "rested"
    results = [m for m in scripted.bodies()[-1]["messages"] if m.get("role") == "tool"]
    assert [m["tool_call_id"] for m in results] == ["n0", "n1", "n2", "n3"]
    assert [m["content"] for m in results] == [f"rested {1 + i / 100} s\n" for i in range(4)]
    assert took < 2.5, took  # one after another would be 4 s and more
