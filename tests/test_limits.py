"""Limits, end to end: the store's counts (exact under concurrent reservations, on SQLite and PostgreSQL), and a
real server whose limits stop calls past their maximum, count only calls that ran, let a rule ask before the
limit, and stop a turn whose token budget is spent, in each API's error shape, streamed and not.
(Two replicas behind HAProxy: tests/test_limits_replicas.py.)"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import urllib.error
import urllib.request

import anthropic
import openai
import pytest
from conftest import YOLO, call, fresh, postgres_schema, recording_tool, serving, write_agent
from test_flows import trail

from toolkeeper.policy import RulesError, load_rules
from toolkeeper.store import Count, open_store

LIMITED = """
limits:
  - id: lookups-per-user
    when: {tool: lookup}
    max: 3
    per: 1h
    scope: user
    reason: At most 3 lookups an hour per person.
  - id: notes-ask
    when: {tool: note}
    max: 1
    per: 1h
    effect: ask
  - id: tokens-per-agent
    counts: tokens
    when: {principal: {agent: {equals: budgeted}}}
    max: 100
    per: 1d
    scope: agent
rules:
  - id: no-forbidden-words
    effect: deny
    reason: That word is not looked up.
    when: {tool: lookup, arguments: {word: {equals: forbidden}}}
  - id: release-ask-early
    effect: deny
    reason: Two releases already this hour; ask the release manager.
    when: {tool: release, limits: {releases.used: {above: 1}}}
  - id: release-reads-counts
    effect: allow
    when: {tool: release}
"""
RELEASES = """
  - id: releases
    when: {tool: release}
    max: 5
    per: 1h
"""
RULES = LIMITED.replace("limits:\n", "limits:\n" + RELEASES.lstrip("\n"), 1)
KEYS = "agents:\n" + "".join(f"  - {{name: {name}, key_sha256: {hashlib.sha256(key.encode()).hexdigest()}}}\n"
                             for name, key in (("budgeted", "sk-budgeted"), ("plain", "sk-test-agent")))
AGENT = YOLO + recording_tool("lookup", "word", "Look a word up.", "The word.") + recording_tool(
    "note", "text", "Write a note.", "The text.") + recording_tool("release", "version", "Release.", "The version.")


@pytest.fixture(scope="module")
def limited(scripted, tmp_path_factory):
    yield from limited_server(scripted, tmp_path_factory.mktemp("limits"))


def limited_server(scripted, directory):
    """A toolkeeper with LIMITED's limits and rules, its agents listed (KEYS), no one to ask."""
    write_agent(directory, AGENT)
    (directory / "rules.yaml").write_text(RULES)
    (directory / "keys.yaml").write_text(KEYS)
    with serving(scripted, directory, "--policy", str(directory / "rules.yaml"), "--consent", "none",
                 "--agent-keys", str(directory / "keys.yaml")) as running:
        yield running


@pytest.fixture
def tkl(limited):
    yield from fresh(limited)


# -- the store's counts -----------------------------------------------------------------------------------------

def test_fifty_reservations_at_once_on_two_postgresql_stores_take_exactly_the_maximum():
    async def main(url: str) -> tuple[int, int]:
        first, second = open_store(url), open_store(url)
        count = Count("deletes", "user=ada", 3600, 20)
        try:
            taken = await asyncio.gather(*(store.take([count]) for store in [first, second] * 25))
            return sum(one[0].taken for one in taken), (await first.used([count]))[0]
        finally:
            await first.close()
            await second.close()

    with postgres_schema() as url:
        assert asyncio.run(main(url)) == (20, 20)


def test_a_reservation_given_back_leaves_the_count_and_a_count_leaves_its_window(location):
    async def main() -> list:
        store = open_store(location)
        count = Count("short", "global", 2, 2)
        try:
            seen = []
            first = await store.take([count])
            seen.append((first[0].taken, first[0].used))
            await store.give_back(first)
            seen.append((await store.used([count]))[0])
            taken = [await store.take([count]) for _ in range(3)]
            seen.append([one[0].taken for one in taken])
            await store.add_to_counts([Count("timed", "tool=x", 60, 1000)], 250)
            seen.append((await store.used([Count("timed", "tool=x", 60, 1000)]))[0])
            await asyncio.sleep(3.1)  # the window (2 s) and its bucket (1 s) have passed
            seen.append((await store.used([count]))[0])
            return seen
        finally:
            await store.close()

    assert asyncio.run(main()) == [(True, 0), 0, [True, True, False], 250, 0]


def test_the_policy_file_says_what_is_wrong_with_a_limit(tmp_path):
    cases = {
        "limits: [{id: a, max: 2, per: 3 weeks}]": "is not a window",
        "limits: [{id: a, max: 2.5, per: 1h}]": "counted whole",
        "limits: [{id: a, max: 2, per: 1h, scope: [global, user]}]": "scope",
        "limits: [{id: a, counts: tokens, max: 2, per: 1h, when: {tool: x}}]": "who and when",
        "limits: [{id: a, counts: tokens, max: 2, per: 1h, effect: ask}]": "a token budget denies",
        "limits: [{id: a, max: 2, per: 1h}, {id: a, max: 3, per: 1h}]": "used twice",
        "limits: [{id: a, max: 2, per: 1h, effect: ask, notify: [pager]}]": "no file declares",
        "limits: [{id: a, max: 0, per: 1h}]": "greater than 0",
        "limits: [{id: deploys.prod, max: 2, per: 1h}]": "should match pattern",  # a rule reads limits.<id>.used
        "limits: [{id: '', max: 2, per: 1h}]": "should match pattern",
        "limits: [{id: deploys, max: 2, per: 1h}]\nrules: [{id: r, effect: ask, when: {limits: {deploy.used: "
        "{above: 1}}}}]": "no limit 'deploy'",  # a typo would never hold
        "limits: [{id: x, max: 2, per: 1h}]\nrules: [{id: x, effect: allow}]": "a rule has this id too",
    }
    for text, said in cases.items():
        (tmp_path / "rules.yaml").write_text(text + "\n")
        with pytest.raises(RulesError, match=said):
            load_rules(tmp_path / "rules.yaml")


# -- calls through a real server -------------------------------------------------------------------------------

def test_calls_past_the_limit_are_denied_with_its_reason_and_only_calls_that_ran_count(scripted, tkl):
    words = ["forbidden", "alpha", "forbidden", "beta", "gamma", "delta", "epsilon"]
    scripted.script({"tool_calls": [call("lookup", {"word": word}, f"lim_{n}") for n, word in enumerate(words)]},
                    {"content": "done"})
    tkl.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "look them up"}])
    ran = sorted(argv[1] for argv in tkl.calls())
    assert len(ran) == 3 and set(ran) <= {"alpha", "beta", "gamma", "delta", "epsilon"}  # the forbidden ones
    answers = {m["tool_call_id"]: m["content"] for m in scripted.bodies()[-1]["messages"] if m["role"] == "tool"}
    limited = [answer for answer in answers.values() if "At most 3 lookups an hour per person." in answer]
    assert len(limited) == 2  # 7 calls: 2 denied by the rule (not counted), 3 ran, 2 stopped by the limit
    records = {r["call_id"]: r for r in trail(tkl) if r.get("call_id", "").startswith("lim_")}
    stopped = [r for r in records.values() if r["decision_source"] == "limits"]
    assert {(r["decision_rule"], r["status"]) for r in stopped} == {("lookups-per-user", "denied")}
    used = stopped[0]["policy_input"]["limits"]["lookups-per-user"]
    assert (used["used"], used["max"], used["remaining"], used["scope"]) == (3, 3, 0, "user=agent:plain")


def test_an_ask_past_its_limit_is_denied_when_no_one_can_be_asked_and_gives_its_count_back(scripted, tkl):
    scripted.script({"tool_calls": [call("note", {"text": "one"}, "note_1")]}, {"content": "ok {tool_result}"},
                    {"tool_calls": [call("note", {"text": "two"}, "note_2")]}, {"content": "ok {tool_result}"},
                    {"tool_calls": [call("note", {"text": "three"}, "note_3")]}, {"content": "ok {tool_result}"})
    client = tkl.client()
    for text in ("one", "two", "three"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"note {text}"}])
    assert [argv[1] for argv in tkl.calls()] == ["one"]
    records = {r["call_id"]: r for r in trail(tkl) if r.get("call_id", "").startswith("note_")}
    asked = records["note_2"]
    assert (asked["status"], asked["decision_source"], asked["decision_rule"]) == ("denied", "consent", "notes-ask")
    assert asked["decision_reason"].startswith("limit notes-ask: 1 of 1 calls in all in the last 1h are used; it ")
    # the asked call was refused (no one to ask): its count was given back, so the third is past the limit, not
    # further past it
    assert records["note_3"]["policy_input"]["limits"]["notes-ask"]["used"] == 1


def test_a_rule_reads_the_count_and_stops_calls_before_the_limit_does(scripted, tkl):
    steps = []
    for n in range(4):
        steps += [{"tool_calls": [call("release", {"version": f"1.{n}"}, f"rel_{n}")]}, {"content": "{tool_result}"}]
    scripted.script(*steps)
    client = tkl.client()
    said = [client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"release 1.{n}"}])
            .choices[0].message.content for n in range(4)]
    assert [argv[1] for argv in tkl.calls()] == ["1.0", "1.1"]
    assert all("Two releases already this hour" in text for text in said[2:]), said
    records = {r["call_id"]: r for r in trail(tkl) if r.get("call_id", "").startswith("rel_")}
    assert records["rel_2"]["decision_rule"] == "release-ask-early"
    assert records["rel_3"]["policy_input"]["limits"]["releases"]["used"] == 2  # denied calls gave theirs back


# -- token budgets ---------------------------------------------------------------------------------------------

def _long_turn(scripted, prefix: str) -> None:
    """A turn of three rounds (two declared calls, then the answer), each round 60 tokens: the budget of 100
    lets the first two rounds go, then stops the third."""
    usage = {"input_tokens": 40, "output_tokens": 20} if prefix in ("messages", "responses") else \
        {"prompt_tokens": 40, "completion_tokens": 20}
    scripted.script({"content": "First I look it up.", "tool_calls": [call("lookup", {"word": f"{prefix}-1"})],
                     "usage": usage},
                    {"content": " Then again.", "tool_calls": [call("lookup", {"word": f"{prefix}-2"})], "usage": usage},
                    {"content": "the answer", "usage": usage})


def _sse(url: str, body: dict, headers: dict) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def budget(scripted, tmp_path):
    """A server of its own: each test spends its budget from nothing."""
    yield from limited_server(scripted, tmp_path)


def test_a_spent_token_budget_stops_the_next_round_of_a_streamed_chat_turn_with_an_error_event(scripted, budget):
    _long_turn(scripted, "chat")
    status, text = _sse(budget.base_url + "/chat/completions", {
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]},
        {"Authorization": "Bearer sk-budgeted"})
    assert status == 200
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert events[-1]["error"]["code"] == "limit_reached", events[-1]
    assert "tokens-per-agent" in events[-1]["error"]["message"] and "the answer" not in text
    said = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert said == "First I look it up. Then again."  # what the model wrote before the stop came through
    assert len(scripted.bodies()) == 2  # the third round was never sent
    assert scripted.bodies()[0]["stream_options"] == {"include_usage": True}  # asked, so its tokens are counted
    # the next turn is refused before its first round: a 429 the clients do not retry
    requests_before = len(scripted.requests())
    client = openai.OpenAI(base_url=budget.base_url, api_key="sk-budgeted", max_retries=3)
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
    assert caught.value.response.headers["x-should-retry"] == "false" and time.monotonic() - started < 2
    assert caught.value.body["code"] == "limit_reached"
    # nor does a model endpoint toolkeeper only passes on reach the model server
    for path in ("/completions", "/responses/compact", "/embeddings"):
        status, text = _sse(budget.base_url + path, {"model": "m", "prompt": "hi", "input": "hi"},
                            {"Authorization": "Bearer sk-budgeted"})
        assert (status, json.loads(text)["error"]["code"]) == (429, "limit_reached"), (path, text)
    assert len(scripted.requests()) == requests_before


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_a_spent_token_budget_ends_a_streamed_turn_in_the_apis_own_error_shape(scripted, budget, api):
    _long_turn(scripted, api)
    if api == "messages":
        client = anthropic.Anthropic(base_url=budget.base_url[: -len("/v1")], api_key="sk-budgeted", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as caught, client.messages.stream(
                model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "go"}]) as events:
            list(events)
        assert caught.value.body["error"]["type"] == "rate_limit_error"
        assert "tokens-per-agent" in caught.value.body["error"]["message"]
    else:
        client = openai.OpenAI(base_url=budget.base_url, api_key="sk-budgeted", max_retries=0)
        with client.responses.stream(model="m", input="go", store=False) as stream:
            events = list(stream)
        failed = events[-1]
        assert failed.type == "response.failed" and failed.response.error.code == "limit_reached"
        assert "tokens-per-agent" in failed.response.error.message
        assert [e.delta for e in events if e.type == "response.output_text.delta"]  # text came before the stop
    assert len(scripted.bodies()) == 2


def test_another_agent_is_not_held_by_an_agents_token_budget(scripted, budget):
    _long_turn(scripted, "other")
    answer = budget.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    assert answer.choices[0].message.content.endswith("the answer")



# -- the other doors: an agent's hook ----------------------------------------------------------------------------

def test_an_agents_hook_calls_are_counted_and_stopped_past_the_limit(tmp_path):
    from test_hooks_undecided import event, post

    write_agent(tmp_path, "upstream: http://127.0.0.1:9/v1\ntools: []\n")
    (tmp_path / "rules.yaml").write_text(
        "limits:\n  - {id: shell-per-session, when: {source: agent, tool: Bash}, max: 2, per: 1h, scope: agent,\n"
        "     reason: Two shell commands an hour through the hook.}\n"
        "rules:\n  - {id: echo-is-fine, effect: allow, when: {source: agent, tool: Bash, arguments: {command: "
        "{runs: {program: echo}}}}}\n  - {id: no-rm, effect: deny, reason: no deleting, when: {source: agent, "
        "tool: Bash, arguments: {command: {runs: {program: rm}}}}}\n")
    from conftest import start_toolkeeper

    process = start_toolkeeper(tmp_path / "agent.yaml", "http://127.0.0.1:9/v1", "--policy",
                               str(tmp_path / "rules.yaml"), "--consent", "none")
    try:
        base = process.url.removesuffix("/v1")
        said = [post(base, "claude-code", event("claude-code", command))
                for command in ("rm -f a", "echo one", "echo two", "echo three")]
    finally:
        process.stop()
    assert [answer["decision"] for answer in said] == ["deny", "allow", "allow", "deny"]
    assert said[3]["reason"] == "Two shell commands an hour through the hook."  # the denied rm did not count


def test_a_passed_on_model_request_counts_against_the_budget_by_its_size(scripted, budget):
    for _ in range(3):  # each about 20 tokens of request and answer: the budget of 100 holds a few
        _sse(budget.base_url + "/embeddings", {"model": "m", "input": "x" * 200}, {"Authorization": "Bearer sk-budgeted"})
    status, text = _sse(budget.base_url + "/embeddings", {"model": "m", "input": "x" * 200},
                        {"Authorization": "Bearer sk-budgeted"})
    assert status == 429 and json.loads(text)["error"]["code"] == "limit_reached"


def test_an_always_grant_for_a_gated_tool_never_lets_calls_past_an_ask_limit(tmp_path):
    """A gated tool (yolo: false) asks by itself; past an ask-limit the limit's ask is the one made, which an
    "always" answer cannot lift: the person is asked, and reads the limit."""
    from toolkeeper.engine import CallHandler, TurnContext
    from toolkeeper.engine.calls import CallContext
    from toolkeeper.engine.types import ToolCall
    from toolkeeper.policy import ApprovalsConsent, Policy
    from toolkeeper.runners import runners_for
    from toolkeeper.tools import load_agent_file

    write_agent(tmp_path, AGENT.replace("yolo: true", "yolo: false"))
    (tmp_path / "rules.yaml").write_text("limits: [{id: notes-ask, when: {tool: note}, max: 1, per: 1h, effect: ask, "
                                         "reason: One note an hour without a person.}]\n")
    agent = load_agent_file(tmp_path / "agent.yaml", serving=False)

    async def main() -> list[tuple[bool, str]]:
        store = open_store(tmp_path / "store.sqlite3")
        handler = CallHandler(runners=runners_for({"argv"}), consent=ApprovalsConsent(store, timeout=0.5),
                              policy=Policy(False, load_rules(tmp_path / "rules.yaml")), store=store)
        await store.grant("writer", "note", "bob")  # an earlier "approve always" of the gated tool
        await store.take([Count("notes-ask", "global", 3600, 1)])  # the hour's one note is written
        try:
            said = []
            for n in range(2):
                outcome = await handler.handle(ToolCall(f"c{n}", "note", '{"text": "t"}'), agent.tools["note"],
                                               CallContext(TurnContext(request_id=f"r{n}", agent="writer")))
                said.append((outcome.ran, outcome.answer))
            return said
        finally:
            await store.close()

    said = asyncio.run(main())
    assert [ran for ran, _ in said] == [False, False]
    assert all("no one answered" in answer for _, answer in said)
