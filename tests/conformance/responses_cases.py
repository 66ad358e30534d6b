"""The Responses API's conformance cases: the kinds of turn the Chat Completions cases play, plus reasoning.

Each case is streamed through a real toolkeeper in front of the strict scripted model; its transcript
holds the exact SSE bytes the agent receives in turn 1, every request sent upstream, the response the
real openai client assembles, and the exact upstream input of turn 2 (the agent resending its whole
history, `store: false`, as Codex does).
"""

from __future__ import annotations

from cases import post_raw, scripted_call, sse_events

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
           "strict": True}
CREATED = 1764000000


def scenarios() -> dict[str, dict]:
    def step(n: int, kind: str, **fields) -> dict:
        return {"id": f"resp_{kind}{n}", "created": CREATED + n, **fields}

    word = {"word": "é\"q☃"}
    return {
        "plain": {"steps": [step(1, "p", content="A plain answer, with no tool.")], "then": "user"},
        "declared-only": {"steps": [step(1, "d", content="Let me look. ", tool_calls=[scripted_call("lookup", word, "call_l1")]),
                                    step(2, "d", content="It is a word.")], "then": "user"},
        "mixed": {"steps": [step(1, "m", content="Checking both. ", tool_calls=[
            scripted_call("lookup", word, "call_l1"), scripted_call("get_weather", {"city": "Oslo"}, "call_w1")])], "then": "tool"},
        "multi-round": {"steps": [step(1, "r", content="First. ", tool_calls=[scripted_call("lookup", {"word": "a"}, "call_a1")]),
                                  step(2, "r", content="Second. ", tool_calls=[scripted_call("lookup", {"word": "b"}, "call_b1")]),
                                  step(3, "r", content="Both done.")], "then": "user"},
        "reasoning": {"steps": [step(1, "s", reasoning="Look it up first.", tool_calls=[scripted_call("lookup", word, "call_s1")]),
                                step(2, "s", reasoning="Now answer.", content="Found it.")], "then": "user"},
    }


def cases() -> list[str]:
    return list(scenarios())


def assemble(events: list[dict]) -> dict:
    """The response the real openai client's stream state builds from the events."""
    from openai import omit
    from openai._models import construct_type
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    state = ResponseStreamState(input_tools=[], text_format=omit)
    final = None
    for event in events:  # built as the client builds them from the wire
        for handled in state.handle_event(construct_type(type_=ResponseStreamEvent, value=event)):
            if handled.type == "response.completed":
                final = handled.response
    return final.model_dump(exclude_none=True, mode="json")


def run_case(kind: str, toolkeeper_url: str, scripted) -> dict:
    scenario = scenarios()[kind]
    question = [{"role": "user", "content": f"Conformance case responses/{kind}: look it up."}]
    request = {"model": "m", "input": question, "tools": [WEATHER], "stream": True, "store": False,
               "include": ["reasoning.encrypted_content"]}
    scripted.script(*scenario["steps"])
    agent_bytes = post_raw(toolkeeper_url, "/responses", request)
    turn1_upstream = scripted.bodies()
    response = assemble(sse_events(agent_bytes))
    then = ({"role": "user", "content": "thanks"} if scenario["then"] == "user" else
            {"type": "function_call_output", "call_id": "call_w1", "output": "sunny, 21 C"})
    turn2 = [*question, *response["output"], then]
    scripted.script({"id": f"resp_{kind}9", "created": CREATED + 9, "content": "ok"})
    post_raw(toolkeeper_url, "/responses", {"model": "m", "input": turn2, "tools": [WEATHER], "store": False})
    return {
        "case": f"responses/{kind}",
        "turn1": {"request": request, "agent_sse": agent_bytes.decode(), "upstream": turn1_upstream,
                  "agent_response": response},
        "turn2": {"agent_input": turn2, "upstream_input": scripted.bodies()[0]["input"]},
    }


def golden_path(kind: str):
    from pathlib import Path

    return Path(__file__).resolve().parent / "golden" / f"responses-{kind}.json"
