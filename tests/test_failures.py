"""Bad things upstream and in tools: a clear error, nothing lost, nothing left running."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse
from pathlib import Path

import openai
import pytest
from conftest import call, user


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def pids(tk, tag: str) -> list[int]:
    path = tk.directory / "pids"
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        name, *numbers = line.split()
        if name == tag:
            return [int(n) for n in numbers]
    return []


def raw_post(tk, body: dict, timeout: float = 10) -> tuple[int, bytes]:
    """A chat request read byte for byte, to see exactly what the agent gets."""
    url = urllib.parse.urlsplit(tk.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    connection.request("POST", url.path + "/chat/completions", json.dumps(body),
                       {"Content-Type": "application/json", "Authorization": "Bearer sk-test"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


# -- upstream failures before the first byte: status and body kept -----------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_upstream_error_keeps_status_and_body(scripted, tk, stream):
    scripted.script({"status": 429, "body": {"error": {"message": "Rate limit reached", "type": "requests",
                                                        "code": "rate_limit_exceeded"}}})
    status, data = raw_post(tk, {"model": "m", "messages": user(), "stream": stream})
    assert status == 429
    assert json.loads(data) == {"error": {"message": "Rate limit reached", "type": "requests",
                                          "code": "rate_limit_exceeded"}}


def test_upstream_500_reaches_the_openai_client_as_such(scripted, tk):
    scripted.script({"status": 500, "body": {"error": {"message": "the GPU caught fire", "type": "server_error"}}})
    with pytest.raises(openai.InternalServerError) as caught:
        tk.client().chat.completions.create(model="m", messages=user())
    assert caught.value.status_code == 500
    assert "the GPU caught fire" in str(caught.value)


def test_upstream_error_in_a_later_round_keeps_its_status(scripted, tk):
    scripted.script({"tool_calls": [call("lookup", {"word": "x"})]},
                    {"status": 503, "body": {"error": {"message": "overloaded"}}})
    status, data = raw_post(tk, {"model": "m", "messages": user()})
    assert status == 503 and b"overloaded" in data
    assert tk.calls() == [["lookup", "x"]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_upstream_timeout_is_a_504(scripted, tk, stream):
    scripted.script({"hang": True})
    started = time.monotonic()
    status, data = raw_post(tk, {"model": "m", "messages": user(), "stream": stream})
    assert status == 504
    assert json.loads(data)["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - started < 10  # toolkeeper's read timeout is 2 s here


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_malformed_upstream_json_is_a_502(scripted, tk, stream):
    scripted.script({"raw": '{"choices": [ {"message": '})
    status, data = raw_post(tk, {"model": "m", "messages": user(), "stream": stream})
    assert status == 502
    assert "malformed JSON" in json.loads(data)["error"]["message"]


def test_broken_sse_before_the_first_byte_is_a_502(scripted, tk):
    scripted.script({"raw": "data: {garbage\n\n", "content_type": "text/event-stream"})
    status, data = raw_post(tk, {"model": "m", "messages": user(), "stream": True})
    assert status == 502
    assert "malformed JSON in a stream event" in json.loads(data)["error"]["message"]


def test_unreachable_upstream_is_a_502(agent_dir, tmp_path):
    from conftest import Toolkeeper, start_toolkeeper

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    process = start_toolkeeper(agent_dir / "agent.yaml", f"http://127.0.0.1:{closed_port}/v1")
    try:
        status, data = raw_post(Toolkeeper(process, agent_dir), {"model": "m", "messages": user()})
    finally:
        process.stop()
    assert status == 502
    error = json.loads(data)["error"]
    assert error["code"] == "upstream_unreachable"
    # said plainly: where, and why; never the HTTP client's internals
    assert error["message"] == f"cannot reach the model server at 127.0.0.1:{closed_port}: Connection refused"


# -- upstream failures after the first byte: an SSE error event and a clean close ----

@pytest.mark.parametrize("quirk", ["error_mid_stream", "drop_mid_stream", "garbage_mid_stream"])
def test_stream_failure_after_the_first_byte(scripted, tk, quirk):
    scripted.script({"content": "Partial answer", "quirks": [quirk]})
    status, data = raw_post(tk, {"model": "m", "messages": user(), "stream": True})
    assert status == 200
    events = [e for e in data.decode().split("\n\n") if e]
    assert events[0].startswith("data: ") and '"role":"assistant"' in events[0]
    assert json.loads(events[-1][len("data: "):])["error"]["message"]
    assert b"[DONE]" not in data


def test_upstream_failure_after_a_hidden_round_mid_stream(scripted, tk):
    scripted.script({"content": "Let me look. ", "tool_calls": [call("lookup", {"word": "x"})]},
                    {"status": 500, "body": {"error": {"message": "round two failed", "type": "server_error"}}})
    with pytest.raises(openai.APIError) as caught:
        for _ in tk.client().chat.completions.create(model="m", messages=user(), stream=True):
            pass
    assert "round two failed" in str(caught.value)


# -- bad requests ----------------------------------------------------------------------

@pytest.mark.parametrize(("body", "expected"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"model": "m"}', "'messages' must be a non-empty list"),
    (b'{"model": "m", "messages": [{"content": "no role"}]}', "every message must be an object with a 'role'"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": "all"}', "'tools' must be a list"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}', "n > 1"),
])
def test_malformed_requests_get_a_clear_400(tk, body, expected):
    url = urllib.parse.urlsplit(tk.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.request("POST", url.path + "/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = json.loads(response.read())
    connection.close()
    assert response.status == 400
    assert expected in data["error"]["message"]


# -- tools that hang, flood or are abandoned -----------------------------------------

def test_a_hanging_tool_is_killed_with_its_whole_group(scripted, tk):
    scripted.script({"tool_calls": [call("hang", {"tag": "t1"})]}, {"content": "{tool_result}"})
    answer = tk.client().chat.completions.create(model="m", messages=user())
    text = answer.choices[0].message.content
    assert text.startswith("The command timed out after 1 s and was stopped (its whole process group killed).")
    assert "started" in text  # what it printed before is kept
    launched = pids(tk, "t1")
    assert len(launched) == 2
    assert wait_for(lambda: not any(alive(p) for p in launched), 5), "a process of the group survived"


def test_a_flood_of_output_is_cut_keeping_head_and_tail(scripted, tk):
    scripted.script({"tool_calls": [call("flood", {"megabytes": 10})]}, {"content": "ok"})
    tk.client().chat.completions.create(model="m", messages=user())
    result = next(m for m in scripted.bodies()[1]["messages"] if m["role"] == "tool")["content"]
    assert result.startswith("BEGIN\n")
    assert result.endswith("END\n")
    assert "bytes cut by toolkeeper; 10,485,770 bytes in all" in result
    assert len(result.encode()) < 4096 + 200


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_an_agent_that_disconnects_cancels_the_running_tool(scripted, tk, stream):
    tag = f"gone-{stream}"
    scripted.script({"content": "Starting the slow job. ", "tool_calls": [call("slow", {"tag": tag})]},
                    {"content": "never sent"})
    url = urllib.parse.urlsplit(tk.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request("POST", url.path + "/chat/completions",
                       json.dumps({"model": "m", "messages": user(), "stream": stream}),
                       {"Content-Type": "application/json"})
    response = None
    if stream:
        response = connection.getresponse()
        assert response.status == 200
        received = b""
        while b'"content":"' not in received:  # the text before the call, streamed as it comes
            piece = response.read1(65536)
            assert piece, f"the stream ended early: {received!r}"
            received += piece
    assert wait_for(lambda: len(pids(tk, tag)) == 2, 10), "the tool did not start"
    launched = pids(tk, tag)
    assert all(alive(p) for p in launched)
    connection.sock.shutdown(socket.SHUT_RDWR)
    if response is not None:
        response.close()
    connection.close()
    assert wait_for(lambda: not any(alive(p) for p in launched), 10), "the tool kept running after the agent left"
    assert len(scripted.bodies()) == 1  # and the model was not asked again
