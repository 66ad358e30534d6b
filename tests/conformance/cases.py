"""The protocol conformance cases: four real servers' shapes by four kinds of turn.

Each case is run against a real toolkeeper in front of the scripted model, and
its transcript is compared with the golden one in golden/: the exact SSE bytes
the agent receives in turn 1, every request toolkeeper sent upstream, and the
exact upstream history of turn 2, built the way an agent builds it.

    python tests/conformance/record.py     # re-record the golden transcripts
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
import urllib.request

SHAPES = {
    # the reference: ids given, arguments streamed in pieces, usage on request
    "openai": [],
    # vLLM (some versions) and LM Studio: tool calls without ids
    "vllm": ["no_ids"],
    # llama.cpp: arguments as a JSON object, split inside escapes when streamed
    "llamacpp": ["args_object", "split_escape"],
    # Ollama: each call whole, every one at index 0, finish_reason "stop" beside tool calls
    "ollama": ["all_index_0", "stop_with_tools", "args_one_chunk"],
}

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}

CREATED = 1764000000


def scripted_call(name: str, arguments: dict, call_id: str) -> dict:
    """One tool call as the scripted model's steps write it, whatever the API."""
    return {"name": name, "arguments": arguments, "id": call_id}


def scenarios(shape: str) -> dict[str, dict]:
    """For each kind of turn: the model's script, and how the agent goes on in turn 2."""
    def step(n: int, **fields) -> dict:
        return {"id": f"chatcmpl-{shape}-{n}", "created": CREATED + n, "quirks": SHAPES[shape], **fields}

    word = {"word": "é\"q☃"}  # an escape and non-ASCII, split anywhere
    return {
        "plain": {
            "steps": [step(1, content="A plain answer, with no tool.")],
            "then": {"role": "user", "content": "thanks"},
        },
        "declared-only": {
            "steps": [step(1, content="Let me look. ", tool_calls=[scripted_call("lookup", word, "call_l1")]),
                      step(2, content="It is a word.")],
            "then": {"role": "user", "content": "thanks"},
        },
        "mixed": {
            "steps": [step(1, content="Checking both. ", tool_calls=[
                scripted_call("lookup", word, "call_l1"), scripted_call("get_weather", {"city": "Oslo"}, "call_w1")])],
            "then": {"role": "tool", "tool_call_id": None, "content": "sunny, 21 C"},  # the agent's own result
        },
        "multi-round": {
            "steps": [step(1, content="First. ", tool_calls=[scripted_call("lookup", {"word": "a"}, "call_a1")]),
                      step(2, content="Second. ", tool_calls=[scripted_call("lookup", {"word": "b"}, "call_b1")]),
                      step(3, content="Both done.")],
            "then": {"role": "user", "content": "thanks"},
        },
    }


def cases() -> list[tuple[str, str]]:
    return [(shape, kind) for shape in SHAPES for kind in scenarios(shape)]


def post_raw(base_url: str, path: str, body: dict, headers: dict[str, str] | None = None) -> bytes:
    """One POST to toolkeeper, its answer's bytes exactly as sent."""
    url = urllib.parse.urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request("POST", url.path + path, json.dumps(body),
                       {"Content-Type": "application/json", **(headers or {"Authorization": "Bearer sk-conformance"})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {data!r}")
    return data


def sse_events(data: bytes) -> list[dict]:
    """Every `data:` line of a stream, parsed (Responses and Messages: no [DONE])."""
    return [json.loads(line[len("data: "):]) for block in data.decode().split("\n\n")
            for line in block.split("\n") if line.startswith("data: ")]


def sse_chunks(data: bytes) -> list[dict]:
    events = [e for e in data.decode().split("\n\n") if e.startswith("data: ")]
    return [json.loads(e[len("data: "):]) for e in events if e != "data: [DONE]"]


def reassemble(chunks: list[dict]) -> dict:
    """The message the real openai client's stream state builds from the chunks."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    state = ChatCompletionStreamState(input_tools=[WEATHER])
    for chunk in chunks:
        list(state.handle_chunk(ChatCompletionChunk.model_validate(chunk)))
    completion = state.get_final_completion()
    return completion.choices[0].message.model_dump(
        exclude_none=True, exclude={"refusal", "annotations", "audio", "function_call", "parsed"})


def run_case(shape: str, kind: str, toolkeeper_url: str, scripted) -> dict:
    """Play the case and return its transcript."""
    scenario = scenarios(shape)[kind]
    question = [{"role": "user", "content": f"Conformance case {shape}/{kind}: look it up."}]
    request = {"model": "m", "messages": question, "tools": [WEATHER], "stream": True,
               "stream_options": {"include_usage": True}}
    scripted.script(*scenario["steps"])
    agent_bytes = post_raw(toolkeeper_url, "/chat/completions", request)
    turn1_upstream = scripted.bodies()

    message = reassemble(sse_chunks(agent_bytes))
    then = dict(scenario["then"])
    if then["role"] == "tool":
        then["tool_call_id"] = message["tool_calls"][0]["id"]
    turn2 = [*question, message, then]
    scripted.script({"id": f"chatcmpl-{shape}-9", "created": CREATED + 9, "content": "ok"})
    with urllib.request.urlopen(urllib.request.Request(
            toolkeeper_url + "/chat/completions", data=json.dumps({"model": "m", "messages": turn2,
                                                                   "tools": [WEATHER]}).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer sk-conformance"}),
            timeout=30) as answer:
        answer.read()
    return {
        "case": f"{shape}/{kind}",
        "quirks": SHAPES[shape],
        "turn1": {"request": request, "agent_sse": agent_bytes.decode(), "upstream": turn1_upstream,
                  "agent_message": message},
        "turn2": {"agent_messages": turn2, "upstream_messages": scripted.bodies()[0]["messages"]},
    }


def golden_path(shape: str, kind: str):
    from pathlib import Path

    return Path(__file__).resolve().parent / "golden" / f"{shape}-{kind}.json"
