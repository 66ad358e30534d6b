"""Whose a stored response is, when toolkeeper holds the model server's key (`api_key_env`).

The model server then takes every agent for one client: toolkeeper records each response id it hands a tenant,
and answers another tenant's GET, DELETE, input_items or previous_response_id as OpenAI answers an id it does not
have, sending nothing on (wire/apis/responses/owners.py). Without `api_key_env` nothing of it applies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import urllib.error
import urllib.request

import openai
import pytest
from conftest import LOOKUP, call, postgres_schema, serving, start_toolkeeper, write_agent

DESK, BENCH = "sk-desk-0123456789", "sk-bench-0123456789"
AGENTS = """
    upstream: http://127.0.0.1:9/v1
    api_key_env: TK_UPSTREAM_KEY
    yolo: true
    agents:
      - {name: desk, key_sha256: "{desk}"}
      - {name: bench, key_sha256: "{bench}"}
    tools:
"""
KEYS = {"desk": hashlib.sha256(DESK.encode()).hexdigest(), "bench": hashlib.sha256(BENCH.encode()).hexdigest()}
ENV = {"TK_UPSTREAM_KEY": "sk-upstream-0123456789"}


@pytest.fixture(scope="module")
def held(scripted, tmp_path_factory):
    """toolkeeper holding the upstream key, with a declared tool (so a turn can have hidden rounds)."""
    directory = tmp_path_factory.mktemp("owners")
    write_agent(directory, AGENTS + LOOKUP, **KEYS)
    with serving(scripted, directory, env=ENV) as running:
        yield running


def client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)


def run(base_url: str, key: str, stream: bool, **kwargs):
    with client(base_url, key) as agent:
        if not stream:
            return agent.responses.create(model="m", **kwargs)
        with agent.responses.stream(model="m", **kwargs) as events:
            return events.get_final_response()


def send(method: str, url: str, key: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Authorization": f"Bearer {key}",
                                                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def previous_ids(scripted) -> list[str | None]:
    return [body.get("previous_response_id") for body in scripted.bodies()]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_owner_continues_its_chain_and_reads_it_back(scripted, held, stream):
    scripted.script({"content": "first"})
    first = run(held.base_url, DESK, stream, input="one")
    scripted.script({"content": "second"})
    second = run(held.base_url, DESK, stream, input="two", previous_response_id=first.id)
    assert second.output_text == "second" and previous_ids(scripted) == [first.id]  # its own id, as it came
    scripted.script({"tool_calls": [call("lookup", {"word": "w"})]}, {"content": "third"})  # hidden rounds
    third = run(held.base_url, DESK, stream, input="three", previous_response_id=second.id)
    scripted.script({"content": "fourth"})
    run(held.base_url, DESK, stream, input="four", previous_response_id=third.id)
    assert previous_ids(scripted) not in ([third.id], [None])  # the last hidden round's, as before
    for given in (first, third):
        status, body = send("GET", f"{held.base_url}/responses/{given.id}", DESK)
        assert status == 200 and body["id"] == given.id


def test_another_tenant_is_told_the_response_does_not_exist_and_nothing_is_sent(scripted, held):
    scripted.script({"content": "desk's own words"}, {"tool_calls": [call("lookup", {"word": "secret"})]},
                    {"content": "desk's answer"})
    plain = run(held.base_url, DESK, False, input="one").id
    hidden = run(held.base_url, DESK, True, input="two").id
    scripted.script({"content": "never asked for", "repeat": True})
    for response_id in (plain, hidden):
        missing = f"No response found with id '{response_id}'."
        for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/input_items"), ("POST", "/cancel")):
            status, body = send(method, f"{held.base_url}/responses/{response_id}{path}", BENCH)
            assert (status, body["error"]["message"]) == (404, missing), (method, path, body)
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refused:
                run(held.base_url, BENCH, stream, input="mine now", previous_response_id=response_id)
            assert refused.value.code == "previous_response_not_found"
        for endpoint in ("compact", "input_tokens"):
            status, body = send("POST", f"{held.base_url}/responses/{endpoint}", BENCH,
                                {"model": "m", "input": "x", "previous_response_id": response_id})
            assert (status, body["error"]["code"]) == (400, "previous_response_not_found")
    assert scripted.requests() == []  # nothing of it reached the model server
    status, _ = send("DELETE", f"{held.base_url}/responses/{plain}", DESK)  # its owner's goes on
    assert status == 404 and scripted.requests()[0]["path"] == f"/v1/responses/{plain}"  # (the scripted model has
    # no DELETE: its 404 is the model server's own)


def test_a_replica_sharing_postgresql_honours_whose_a_response_is(scripted, tmp_path):
    """The id is recorded by one replica and read by the other; the model server's answer went back as it came
    (no declared tool, nothing renumbered), and its id is recorded all the same."""
    write_agent(tmp_path, AGENTS + "      []\n", **KEYS)
    with postgres_schema() as url, contextlib.ExitStack() as stack:
        replicas = []
        for _ in range(2):
            replicas.append(start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--store", url, "--audit",
                                             url, env=ENV))
            stack.callback(replicas[-1].stop)
        one, other = replicas
        scripted.script({"content": "on one"})
        first = run(one.url, DESK, False, input="one")
        scripted.script({"content": "on the other"})
        assert run(other.url, DESK, False, input="two", previous_response_id=first.id).output_text == "on the other"
        assert previous_ids(scripted) == [first.id]
        assert send("GET", f"{other.url}/responses/{first.id}", DESK)[0] == 200
        scripted.script({"content": "never asked for"})
        assert send("GET", f"{other.url}/responses/{first.id}", BENCH)[0] == 404
        with pytest.raises(openai.BadRequestError):
            run(other.url, BENCH, True, input="mine now", previous_response_id=first.id)
        assert scripted.requests() == []


def test_without_api_key_env_nothing_changes_and_nothing_is_written(scripted, tmp_path):
    """The agent's own key goes upstream, and the model server keeps each key to its own responses: toolkeeper
    passes every id on, and writes nothing for a turn with nothing hidden."""
    write_agent(tmp_path, AGENTS.replace("    api_key_env: TK_UPSTREAM_KEY\n", "") + LOOKUP, **KEYS)
    with serving(scripted, tmp_path) as running:
        scripted.script({"content": "first"}, {"content": "second"})
        first = run(running.base_url, DESK, False, input="one")
        run(running.base_url, DESK, True, input="two", previous_response_id=first.id)
        scripted.script({"content": "the model server's to refuse"})
        run(running.base_url, BENCH, False, input="three", previous_response_id=first.id)
        assert previous_ids(scripted) == [first.id]  # passed on: the server, which sees bench's key, decides
        assert send("GET", f"{running.base_url}/responses/{first.id}", BENCH)[0] == 200  # the scripted model's
        with contextlib.closing(sqlite3.connect(tmp_path / "toolkeeper.sqlite3")) as store:
            assert store.execute("SELECT COUNT(*) FROM links").fetchone() == (0,)
