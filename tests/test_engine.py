"""The engine and one call's path, in-process: a MockModel answers each round, the tools run for real (argv).

Fast unit tests beside the end-to-end suites: no HTTP, no server process.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import write_agent

from toolkeeper.engine import CallHandler, Engine, MockModel, Round, TurnContext, TurnResult, Visible, Working, answer
from toolkeeper.policy import NoConsent, Policy, load_rules
from toolkeeper.runners import runners_for
from toolkeeper.tools import load_agent_file

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
      - name: echo_word
        description: Echo a word back. Use it when asked to echo. Returns the word.
        parameters:
          word: {type: string, description: "The word."}
        command: ["{python}", "-c", "import sys; print('echo:', sys.argv[1])", "{{word}}"]
      - name: release_version
        description: Release a version. Use it when asked to release. Returns the log.
        parameters:
          version: {type: string, pattern: "^[0-9.]+$", description: "The version."}
        command: ["{python}", "-c", "print('released')", "{{version}}"]
"""


@pytest.fixture
def agent(tmp_path):
    return load_agent_file(write_agent(tmp_path, AGENT), serving=False)


@pytest.fixture
def runners():
    runners = runners_for({"argv"})
    yield runners
    runners["argv"].close()


@pytest.fixture
def engine_for(runners):
    def engine_for(agent, policy: Policy | None = None) -> Engine:
        return Engine(agent, CallHandler(runners=runners, consent=NoConsent(), policy=policy or Policy(yolo=True)))

    return engine_for


def run(engine: Engine, model: MockModel, messages: list[dict] | None = None, **request) -> list:
    async def collect() -> list:
        body = {"messages": messages or [{"role": "user", "content": "go"}], **request}
        return [event async for event in engine.run(body, model, TurnContext(request_id="r1", agent="a"))]

    return asyncio.run(collect())


def results(request) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m.get("role") == "tool"]


def test_a_turn_without_declared_calls_is_one_round_the_agent_sees_whole(agent, engine_for):
    model = MockModel(lambda body, previous: answer("hello", usage={"total_tokens": 3}))
    events = run(engine_for(agent), model)
    assert [type(e) for e in events] == [Visible, TurnResult]
    result = events[-1]
    assert result.text == {"content": "hello"} and result.rounds == 1 and result.exchange == []
    assert result.usage == {"total_tokens": 3} and result.finish_reason == "stop"
    # the declared tools were offered, and their names are the ones the agent never sees
    request = model.requests[0]
    assert {t["function"]["name"] for t in request.body["tools"]} == {"echo_word", "release_version"}
    assert request.hidden == {"echo_word", "release_version"} and request.previous is None


def test_a_declared_call_runs_and_its_result_goes_to_the_model_not_the_agent(agent, engine_for):
    def model_answer(body, previous):
        if previous is None:
            return answer("Let me check. ", calls=[("echo_word", {"word": "kiwi"})], usage={"total_tokens": 2})
        return answer(f"It said {results_of(body)[-1]}", usage={"total_tokens": 5})

    model = MockModel(model_answer)
    events = run(engine_for(agent), model)
    working = [e for e in events if isinstance(e, Working)]
    assert [w.tool for w in working] == ["echo_word"] and working[0].head["id"] == "mock-1"
    result = events[-1]
    assert result.text["content"] == "Let me check. It said echo: kiwi\n"
    assert result.tool_calls == [] and result.rounds == 2 and result.usage == {"total_tokens": 7}
    # the second round knows the first, and the model saw the hidden exchange
    assert isinstance(model.requests[1].previous, Round)
    assert model.requests[1].previous.tool_calls[0].name == "echo_word"
    assert results(model.requests[1]) == ["echo: kiwi\n"]
    assert [m["role"] for m in result.exchange] == ["assistant", "tool", "assistant"]


def results_of(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m.get("role") == "tool"]


def test_an_invalid_call_is_answered_with_what_to_fix_and_runs_nothing(agent, engine_for):
    def model_answer(body, previous):
        if previous is None:
            return answer(calls=[("release_version", {"version": "1.2; rm -rf ~"})])
        return answer("gave up")

    model = MockModel(model_answer)
    run(engine_for(agent), model)
    [said] = results(model.requests[1])
    assert "release_version" in said and "1.2; rm -rf ~" in said and "released" not in said


def test_a_mixed_round_returns_the_agents_own_calls_and_runs_the_declared_one(agent, engine_for):
    model = MockModel(lambda body, previous: answer(calls=[("echo_word", {"word": "a"}), ("read_file", {"p": 1})]))
    events = run(engine_for(agent), model, tools=[{"type": "function", "function": {"name": "read_file"}}])
    result = events[-1]
    assert [c.name for c in result.tool_calls] == ["read_file"] and result.finish_reason == "tool_calls"
    assert len(model.requests) == 1
    assert [m.get("content") for m in result.exchange if m["role"] == "tool"] == ["echo: a\n"]


def test_the_same_call_again_and_again_is_stopped_and_then_ends_the_turn(agent, engine_for):
    model = MockModel(lambda body, previous: answer(calls=[("echo_word", {"word": "loop"})]))
    events = run(engine_for(agent), model)
    said = results(model.requests[-1])
    assert said[:2] == ["echo: loop\n"] * 2
    assert said[2].startswith("Stop: you have called echo_word with these same arguments 3 times")
    result = events[-1]
    assert len(model.requests) == 5 and "toolkeeper ended this turn" in result.said
    assert result.text["content"].endswith(result.said) and result.finish_reason == "stop"


def test_a_model_that_never_stops_calling_is_stopped_after_the_last_round(agent, engine_for):
    counter = iter(range(100))
    model = MockModel(lambda body, previous: answer(calls=[("echo_word", {"word": str(next(counter))})]))
    engine = engine_for(agent)
    engine.max_rounds = 4
    result = run(engine, model)[-1]
    assert len(model.requests) == 4 and "after 4 rounds" in result.said


def test_a_rule_denies_a_declared_call_and_the_model_reads_why(agent, engine_for, tmp_path):
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text("rules:\n  - id: no-echo\n    effect: deny\n    reason: echo is off today\n"
                          "    when: {tool: echo_word}\n")
    policy = Policy(yolo=True, rules=load_rules(rules_file))

    def model_answer(body, previous):
        return answer("ok") if previous else answer(calls=[("echo_word", {"word": "x"})])

    model = MockModel(model_answer)
    run(engine_for(agent, policy), model)
    [said] = results(model.requests[1])
    assert said.startswith("Not run: echo_word was not allowed") and "echo is off today" in said


def test_a_request_under_tool_choice_none_gets_no_declared_tool(agent, engine_for):
    model = MockModel(lambda body, previous: answer("fine"))
    run(engine_for(agent), model, tool_choice="none")
    assert "tools" not in model.requests[0].body and model.requests[0].hidden == frozenset()


def test_the_call_handler_reloads_its_policy_and_keeps_the_runners_a_turn_may_still_use(agent, runners, tmp_path):
    handler = CallHandler(runners=runners, consent=NoConsent(), policy=Policy(yolo=True))
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text("rules:\n  - id: no-echo\n    effect: deny\n    reason: echo is off\n    when: {tool: echo_word}\n")
    old_argv = handler.runners["argv"]
    handler.reload(policy=Policy(yolo=False, rules=load_rules(rules_file)), runners={"wasm": old_argv})
    assert handler.policy.yolo is False and handler.runners == {"argv": old_argv, "wasm": old_argv}
    turn = TurnContext(request_id="r", agent="a", agent_header="team-x")
    document = handler.document(agent.tools["echo_word"], {"word": "x"}, ["echo", "x"], turn)
    assert document["tool"] == {"name": "echo_word", "source": "declared", "kind": "function", "tier": "gated",
                                "runner": "argv", "visibility": "inline"}
    assert document["mode"] == {"yolo": False, "interactive": False} and document["agent"]["header"] == "team-x"
    decision = asyncio.run(handler.policy.decide(document))
    assert (decision.effect, decision.rule_id) == ("deny", "no-echo")


def test_a_built_in_call_reaches_the_policy_by_its_kind(runners):
    handler = CallHandler(runners=runners, consent=NoConsent(), policy=Policy(yolo=True))
    document = handler.document("shell", {"action": {"commands": ["ls"]}}, None, TurnContext(), kind="shell_call")
    assert (document["tool"]["name"], document["tool"]["source"], document["tool"]["kind"]) == (
        "shell", "agent", "shell_call")
    hosted = handler.document("web_search", "(unknown)", None, TurnContext(), kind="web_search", source="hosted")
    assert hosted["tool"]["source"] == "hosted"
    assert asyncio.run(handler.policy.decide(hosted)).effect == "allow"  # no rule: the offer stands


def test_check_call_parses_checks_and_renders_or_says_what_to_fix(agent):
    from toolkeeper.tools import check_call

    tool = agent.tools["release_version"]
    good = check_call(tool, '{"version": "1.2"}')
    assert good.problems == [] and good.values == {"version": "1.2"} and good.argv[-1] == "1.2"
    bad = check_call(tool, '{"version": "1.2; rm -rf ~"}')
    assert bad.problems and bad.values is None and bad.quoted == {"version": "1.2; rm -rf ~"}
    assert check_call(tool, "{not json").quoted == "{not json"
