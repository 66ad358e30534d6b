"""Secrets in what goes to the model: found by detect-secrets' plugins, redacted, withheld or let through.

The unit tests give the detector each kind and the near misses it must leave alone (a commit id, a UUID, a
lock file's digests, a URL without credentials). The end-to-end tests run a real `toolkeeper serve` in front of
the scripted model server, which refuses any request holding a canary this module plants: a secret that reached
it would fail the test whatever the test asserts. They read the body the model got too: a declared tool's result,
and the agent's own tools' results as the agent sends them back on each API (streamed and not), reach it redacted,
and the rest of the request as the agent sent it.
"""

from __future__ import annotations

import base64
import json
import random
import sqlite3
import string
import time
import urllib.request

import anthropic
import jwt
import pytest
from conftest import call, start_toolkeeper, user, write_agent
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from toolkeeper.policy import find_secrets, guard_result, redact_secrets, scan_arguments, secrets_redaction

RANDOM = random.Random(41)  # the same secrets each run: a failure can be read again


def _drawn(alphabet: str, length: int) -> str:
    return "".join(RANDOM.choice(alphabet) for _ in range(length))


UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
AWS_KEY = "AKIA" + _drawn(UPPER_DIGITS, 16)
GITHUB_TOKEN = "ghp_" + _drawn(ALNUM, 36)
SSH_KEY = ed25519.Ed25519PrivateKey.generate().private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()).decode()
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()).decode()
PKCS8_KEY = ed25519.Ed25519PrivateKey.generate().private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")).decode()
GITLAB_TOKEN = "glpat-" + _drawn(ALNUM, 20)
SLACK_TOKEN = f"xoxb-{_drawn(string.digits, 12)}-{_drawn(string.digits, 13)}-{_drawn(ALNUM, 24)}"
STRIPE_KEY = "sk_live_" + _drawn(ALNUM, 24)
JWT = jwt.encode({"sub": "user-" + _drawn(ALNUM, 8), "admin": True}, "k" * 32, algorithm="HS256")
DB_PASSWORD = _drawn(ALNUM, 14)
DB_URL = f"postgresql://app:{DB_PASSWORD}@db.internal:5432/orders"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq9Ekw3Tf2"  # 40 characters of base64, as aws_secret_access_key is
COMMIT = "4f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39"


# -- the detector ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("secret", "kind"), [
    (AWS_KEY, "aws_access_key"),
    (GITHUB_TOKEN, "github_token"),
    (GITLAB_TOKEN, "gitlab_token"),
    (SLACK_TOKEN, "slack_token"),
    (STRIPE_KEY, "stripe_key"),
    (JWT, "jwt"),
    (AWS_SECRET, "high_entropy_string"),
    ("sk-" + _drawn(ALNUM, 20) + "T3BlbkFJ" + _drawn(ALNUM, 20), "openai_key"),
    ("pypi-AgEIcHlwaS5vcmc" + _drawn(ALNUM, 72), "pypi_token"),
    ("SG." + _drawn(ALNUM, 22) + "." + _drawn(ALNUM, 43), "sendgrid_key"),
    ("SK" + _drawn(string.ascii_lowercase + string.digits, 32), "twilio_key"),
    ("AccountKey=" + _drawn(ALNUM, 86) + "==", "azure_storage_key"),
    (_drawn(string.ascii_lowercase + string.digits, 32) + "-us14", "mailchimp_key"),
    ("sq0csp-" + _drawn(ALNUM, 43), "square_oauth_secret"),
    (_drawn(string.digits, 9) + ":" + _drawn(ALNUM, 35), "telegram_token"),
    ("M" + _drawn(ALNUM, 23) + "." + _drawn(ALNUM, 6) + "." + _drawn(ALNUM, 27), "discord_token"),
], ids=lambda value: value if isinstance(value, str) and value.islower() else None)
def test_each_kind_is_found_and_replaced_by_a_marker_naming_it(secret, kind):
    text = f"export VALUE={secret}\nnext line"
    clean, found = redact_secrets(text)
    assert [(f.kind, text[f.start:f.end]) for f in found] == [(kind, secret)]
    assert clean == f"export VALUE=[REDACTED: {kind}]\nnext line"


PUTTY_KEY = ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: me@laptop\nPublic-Lines: 2\n"
             f"AAAAC3NzaC1lZDI1NTE5AAAAI{_drawn(ALNUM, 40)}\nPrivate-Lines: 1\n{_drawn(ALNUM, 44)}\n"
             f"Private-MAC: {_drawn('0123456789abcdef', 64)}\n")


@pytest.mark.parametrize("key", [SSH_KEY, RSA_KEY, PKCS8_KEY, PUTTY_KEY],
                         ids=["openssh", "rsa", "pkcs8-encrypted", "putty"])
def test_a_private_key_is_redacted_as_one_whole_block(key):
    clean, found = redact_secrets(f"$ cat ~/.ssh/id\n{key}$ echo done\n")
    assert [f.kind for f in found] == ["private_key"]
    assert clean == "$ cat ~/.ssh/id\n[REDACTED: private_key]\n$ echo done\n"


def test_a_private_key_inside_json_and_one_cut_off_are_redacted_to_their_end():
    escaped = json.dumps({"private_key": RSA_KEY, "type": "service_account"})
    clean, _ = redact_secrets(escaped)
    assert json.loads(clean) == {"private_key": "[REDACTED: private_key]\n", "type": "service_account"}
    cut = RSA_KEY[:300]  # a result cut at its byte limit: nothing after BEGIN is kept
    assert redact_secrets("head\n" + cut)[0] == "head\n[REDACTED: private_key]"


def test_an_npm_token_is_redacted_and_its_registry_kept():
    token = "npm_" + _drawn(ALNUM, 36)
    clean, found = redact_secrets(f"//registry.npmjs.org/:_authToken={token}\n")
    assert clean == "//registry.npmjs.org/:_authToken=[REDACTED: npm_token]\n"
    assert [f.kind for f in found] == ["npm_token"]


def test_a_urls_password_is_redacted_not_its_host():
    clean, found = redact_secrets(f"DATABASE_URL={DB_URL}")
    assert clean == "DATABASE_URL=postgresql://app:[REDACTED: basic_auth]@db.internal:5432/orders"
    assert [f.kind for f in found] == ["basic_auth"]


@pytest.mark.parametrize("key", [RSA_KEY, PKCS8_KEY], ids=["long", "short"])
def test_a_base64_private_key_is_found_however_long(key):
    blob = base64.b64encode(key.encode()).decode()
    assert [f.kind for f in find_secrets(f"client-key-data: {blob}\n")] == ["private_key"]


@pytest.mark.parametrize("text", [
    f"commit {COMMIT}\nAuthor: A <a@example.com>",
    "id 123e4567-e89b-12d3-a456-426614174000 created",
    "requests==2.32.3 --hash=sha256:70761cfe03c773ceb22aa2f671b4757976145175cdfca038c02654d061d6dcc6",
    '"integrity": "sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg=="',
    "golang.org/x/text v0.3.7 h1:olpwvP2KacW1ZWvsR7uQhoyTYvKAupfQrRGBFM352Gk=",
    'name = "idna"\nversion = "3.7"\nfiles = [{file = "idna-3.7.tar.gz", hash = '
    '"sha256:028ff3aadf0609c1fd278d8ea3089299412a7a8b9bd005dd08b9f8285bcb5cfc"}]',
    "see https://github.com/python/cpython/blob/986a4e1b6fcae7fe7a1d0a26aea446107dd58dd2/Objects/typeobject.c",
    "https://example.com/docs/getting-started?page=2#install",
    'if line.startswith("-----BEGIN RSA PRIVATE KEY-----"):\n    return "a key"',
    "PLUGINS = [r'BEGIN PRIVATE KEY', r'PuTTY-User-Key-File-2']\nmore code",
    "ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'",
    "class BetaManagedAgentsThreadLimitWorkflowRunErrorObject(BaseModel): ...",
    "/usr/lib/python3/dist-packages/setuptools/_distutils/command/build_ext.py",
    "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 4).decode(),
], ids=["commit", "uuid", "pip-hash", "npm-integrity", "go-sum", "poetry-lock", "link-with-commit", "plain-url",
        "pem-header-in-code", "putty-header-in-code", "alphabet", "camel-case", "path", "image-data"])
def test_near_misses_are_not_secrets(text):
    assert find_secrets(text) == []
    assert redact_secrets(text)[0] == text


@pytest.mark.parametrize("text", [
    "eyJ" * 80000,
    ("BEGIN RSA PRIVATE KEY\nProc-Type: " + "x" * 50) * 8000,
    "BEGIN RSA PRIVATE KEY" + " " * 250000 + "x",
    "//x" * 40000 + "/:_authToken=" + "x/:_authToken=" * 10000,
    ("-----BEGIN RSA PRIVATE KEY-----\n" + "MIIEpAIBAAKCAQEA" * 4 + "\n") * 4000,
], ids=["jwt-starts", "pem-headers", "pem-spaces", "npm-slashes", "pem-without-end"])
def test_a_text_written_to_slow_the_scan_costs_one_pass(text):
    """A result from outside (a web page) may be written against the detector's expressions: a quarter of a
    megabyte scanned in one pass takes tens of milliseconds; tried again from each position, minutes."""
    started = time.monotonic()
    find_secrets(text)
    assert time.monotonic() - started < 3


def test_a_commit_id_passes_beside_a_secret():
    clean, _ = redact_secrets(f"{COMMIT} {GITHUB_TOKEN}")
    assert clean == f"{COMMIT} [REDACTED: github_token]"


def test_the_arguments_scan_says_where_and_never_the_value():
    found = scan_arguments({"command": f"curl -H 'Authorization: token {GITHUB_TOKEN}' https://x", "files": [
        "a.txt", f"aws={AWS_KEY}"], "count": 3})
    assert found == [{"kind": "github_token", "where": "arguments.command"},
                     {"kind": "aws_access_key", "where": "arguments.files[1]"}]
    assert GITHUB_TOKEN not in json.dumps(found)


def test_the_modes_redact_block_and_allow():
    text = f"key: {AWS_KEY}"
    redacted = guard_result(text, "redact")
    assert (redacted.value, redacted.kept) == ("key: [REDACTED: aws_access_key]",) * 2
    assert redacted.findings == ({"kind": "aws_access_key", "where": "result", "action": "redact"},)
    blocked = guard_result(text, "block")
    assert blocked.value.startswith("Withheld by toolkeeper: this result holds secrets (aws_access_key)")
    allowed = guard_result(text, "allow")
    assert (allowed.value, allowed.kept, allowed.changed) == (text, "key: [REDACTED: aws_access_key]", False)
    assert guard_result("nothing here", "block").value == "nothing here"


def test_a_result_made_of_parts_is_read_part_by_part_and_binary_data_is_skipped():
    parts = [{"type": "text", "text": "first"}, {"type": "image", "source": {"type": "base64", "data": AWS_SECRET}},
             {"type": "text", "text": f"then {GITHUB_TOKEN}"}]
    guarded = guard_result(parts, None)
    assert guarded.value == [parts[0], parts[1], {"type": "text", "text": "then [REDACTED: github_token]"}]
    assert guarded.findings == ({"kind": "github_token", "where": "result[2].text", "action": "redact"},)


def test_the_findings_of_a_text_are_remembered_by_its_digest():
    text = "x" * 40 + AWS_KEY
    first = secrets_redaction(text)
    assert secrets_redaction(text).findings is first.findings  # the second time: looked up, not scanned
    assert first.text.endswith("[REDACTED: aws_access_key]")


# -- end to end ----------------------------------------------------------------------------------------------------

CANARIES = {"aws": AWS_KEY, "ssh": SSH_KEY, "github": GITHUB_TOKEN, "jwt": JWT, "database": DB_PASSWORD}
LEAKY = f"""# .env of the orders service
AWS_ACCESS_KEY_ID={AWS_KEY}
GITHUB_TOKEN={GITHUB_TOKEN}
SESSION={JWT}
DATABASE_URL={DB_URL}
BUILT_FROM={COMMIT}
{SSH_KEY}"""
# a secret no canary guards: `allow` passes it on, on purpose
ALLOWED = "AKIA" + _drawn(UPPER_DIGITS, 16)
SHOW = """
      - name: {name}
        description: Show a file, its secrets {mode}ed. Use it when the user asks to see a file. Returns its text.
        parameters:
          path: {{type: string, pattern: "^/", description: "The file's absolute path, like /srv/app/.env."}}
        command: ["{{python}}", "{{tools}}/show.py", "{{{{path}}}}"]
        secrets: {mode}
"""
AGENT = "\n    upstream: http://127.0.0.1:9/v1\n    yolo: true\n    tools:\n" + "".join(
    SHOW.format(name=name, mode=mode) for name, mode in (("show", "redact"), ("show_blocked", "block"),
                                                         ("show_allowed", "allow")))
RULES = """
rules:
  - id: env-files-withheld
    effect: label
    secrets: block
    when: {source: agent, tool: read_env}
  - id: public-notes-pass
    effect: label
    secrets: allow
    when: {source: agent, tool: read_public}
"""
OWN_TOOLS = ("read_file", "read_env", "read_public")


def function(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


@pytest.fixture(scope="module")
def tks(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("secrets")
    write_agent(directory, AGENT)
    (directory / "rules.yaml").write_text(RULES)
    (directory / "leaky.env").write_text(LEAKY)
    (directory / "allowed.txt").write_text(f"the demo key: {ALLOWED}\n")
    plant(scripted, CANARIES)
    process = start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--policy", str(directory / "rules.yaml"),
                               "--audit", str(directory / "audit.sqlite3"), "--store", str(directory / "store.sqlite3"))
    try:
        from conftest import Toolkeeper

        yield Toolkeeper(process, directory)
    finally:
        process.stop()
        plant(scripted, {})


def plant(scripted, canaries: dict[str, str]) -> None:
    request = urllib.request.Request(scripted.root + "/_canaries", data=json.dumps({"canaries": canaries}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read())["canaries"] == sorted(canaries)


def trail(directory) -> dict[str, dict]:
    """Each call's record, its events merged, by call id."""
    with sqlite3.connect(directory / "audit.sqlite3") as db:
        rows = db.execute("SELECT record_id, body FROM audit_events ORDER BY seq").fetchall()
    merged: dict[str, dict] = {}
    for record_id, body in rows:
        merged.setdefault(record_id, {}).update(json.loads(body))
    return {record["call_id"]: record for record in merged.values() if record.get("call_id")}


def no_canary_in_the_trail(directory) -> None:
    kept = b"".join(path.read_bytes() for path in directory.iterdir() if path.name.startswith("audit.sqlite3"))
    for name, value in CANARIES.items():
        for line in value.splitlines():
            assert line.startswith("-----") or line.encode() not in kept, name


def test_the_scripted_model_refuses_a_request_holding_a_canary(scripted, tks):
    scripted.script({"content": "never"})
    with pytest.raises(Exception) as refused:
        tks.client().chat.completions.create(model="m", messages=[{"role": "user", "content": f"key {AWS_KEY}"}])
    assert refused.value.status_code == 400 and "canary secret 'aws'" in str(refused.value)
    assert scripted.requests()[-1]["canary"] == "aws"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_declared_tools_secrets_reach_the_model_redacted(scripted, tks, stream):
    scripted.script({"tool_calls": [call("show", {"path": str(tks.directory / "leaky.env")}, f"d_show_{stream}")]},
                    {"content": "It printed: {tool_result}"})
    client = tks.client()
    if stream:
        chunks = client.chat.completions.create(model="m", messages=user(), stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = client.chat.completions.create(model="m", messages=user()).choices[0].message.content
    told = scripted.bodies()[-1]["messages"][-1]["content"]
    assert told.strip() == text.removeprefix("It printed: ").strip()
    for kind in ("aws_access_key", "github_token", "jwt", "basic_auth", "private_key"):
        assert f"[REDACTED: {kind}]" in told
    assert f"BUILT_FROM={COMMIT}" in told  # the near miss passes untouched
    record = trail(tks.directory)[f"d_show_{stream}"]
    assert {(f["kind"], f["where"], f["action"]) for f in record["secrets"]} == {
        (kind, "result", "redact") for kind in ("aws_access_key", "basic_auth", "github_token", "jwt", "private_key")}
    assert "[REDACTED: aws_access_key]" in record["answer"]
    no_canary_in_the_trail(tks.directory)


def test_a_declared_tool_that_blocks_withholds_its_result_and_says_why(scripted, tks):
    scripted.script({"tool_calls": [call("show_blocked", {"path": str(tks.directory / "leaky.env")}, "d_block")]},
                    {"content": "{tool_result}"})
    text = tks.client().chat.completions.create(model="m", messages=user()).choices[0].message.content
    assert text.startswith("Withheld by toolkeeper: this result holds secrets (aws_access_key, basic_auth, "
                           "github_token, jwt, private_key)")
    assert COMMIT not in text  # all of it withheld
    record = trail(tks.directory)["d_block"]
    assert {f["action"] for f in record["secrets"]} == {"block"} and record["answer"] == text


def test_a_declared_tool_that_allows_passes_its_secret_and_the_trail_still_keeps_none(scripted, tks):
    scripted.script({"tool_calls": [call("show_allowed", {"path": str(tks.directory / "allowed.txt")}, "d_allow")]},
                    {"content": "{tool_result}"})
    text = tks.client().chat.completions.create(model="m", messages=user()).choices[0].message.content
    assert text.strip() == f"the demo key: {ALLOWED}"
    record = trail(tks.directory)["d_allow"]
    assert record["secrets"] == [{"kind": "aws_access_key", "where": "result", "action": "allow"}]
    assert ALLOWED not in record["answer"] and "[REDACTED: aws_access_key]" in record["answer"]


def found_total(tks, action: str, kind: str) -> float:
    with urllib.request.urlopen(tks.base_url[: -len("/v1")] + "/metrics", timeout=10) as page:
        text = page.read().decode()
    series = f'toolkeeper_secrets_found_total{{action="{action}",kind="{kind}"}} '
    return next((float(line[len(series):]) for line in text.splitlines() if line.startswith(series)), 0.0)


def test_the_metrics_count_each_finding_by_kind_and_action(scripted, tks):
    before = found_total(tks, "block", "github_token")
    test_a_declared_tool_that_blocks_withholds_its_result_and_says_why(scripted, tks)
    assert found_total(tks, "block", "github_token") == before + 1


# -- the agent's own tools' results, as its next request carries them ----------------------------------------------


def own_call(scripted, tool: str, call_id: str) -> None:
    scripted.script({"tool_calls": [call(tool, {"path": "/srv/orders/.env"}, call_id)]}, {"content": "noted"})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_the_agents_result_is_redacted_and_the_rest_of_the_body_is_as_sent(scripted, tks, stream):
    call_id = f"c_own_{stream}"
    own_call(scripted, "read_file", call_id)
    client = tks.client()
    first = user()
    tools = [function(name) for name in OWN_TOOLS]
    message = client.chat.completions.create(model="m", messages=first, tools=tools).choices[0].message
    assert [c.id for c in message.tool_calls] == [call_id]
    sent = [*first, message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call_id, "content": LEAKY}]
    answer = client.chat.completions.create(model="m", messages=sent, tools=tools, stream=stream)
    text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices) if stream else \
        answer.choices[0].message.content
    assert text == "noted"
    upstream = scripted.bodies()[-1]["messages"]
    assert upstream[:-1] == sent[:-1]
    assert upstream[-1] == {**sent[-1], "content": secrets_redaction(LEAKY).text}
    assert f"BUILT_FROM={COMMIT}" in upstream[-1]["content"]
    record = trail(tks.directory)[call_id]
    assert record["status"] == "ok" and {f["kind"] for f in record["secrets"]} == {
        "aws_access_key", "basic_auth", "github_token", "jwt", "private_key"}
    no_canary_in_the_trail(tks.directory)


RESPONSES_TOOLS = [{"type": "function", **function(name)["function"]} for name in OWN_TOOLS]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_responses_the_agents_result_is_redacted_and_the_rest_of_the_input_is_as_sent(scripted, tks, stream):
    call_id = f"r_own_{stream}"
    own_call(scripted, "read_file", call_id)
    client = tks.client()
    first = [{"role": "user", "content": user()[0]["content"]}]
    kwargs = {"model": "m", "tools": RESPONSES_TOOLS, "store": False}
    response = client.responses.create(input=first, **kwargs)
    sent = [*first, *[i.model_dump(exclude_none=True) for i in response.output],
            {"type": "function_call_output", "call_id": call_id,
             "output": [{"type": "input_text", "text": "the file:"}, {"type": "input_text", "text": LEAKY}]}]
    if stream:
        with client.responses.stream(input=sent, **kwargs) as events:
            text = events.get_final_response().output_text
    else:
        text = client.responses.create(input=sent, **kwargs).output_text
    assert text == "noted"
    upstream = scripted.bodies()[-1]["input"]
    assert upstream[:-1] == sent[:-1]
    assert upstream[-1] == {**sent[-1], "output": [sent[-1]["output"][0],
                                                   {"type": "input_text", "text": secrets_redaction(LEAKY).text}]}
    record = trail(tks.directory)[call_id]
    assert ("private_key", "result[1].text", "redact") in {(f["kind"], f["where"], f["action"])
                                                            for f in record["secrets"]}


READ_ANTHROPIC = {"name": "read_file", "description": "Read a file.",
                  "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_messages_the_agents_result_is_redacted_and_the_rest_is_as_sent(scripted, tks, stream):
    call_id = f"toolu_own_{stream}"
    own_call(scripted, "read_file", call_id)
    first = [{"role": "user", "content": user()[0]["content"]}]
    kwargs = {"model": "claude-test", "max_tokens": 256, "tools": [READ_ANTHROPIC]}
    with anthropic.Anthropic(base_url=tks.base_url[: -len("/v1")], api_key="sk-ant-t", max_retries=0) as api:
        message = api.messages.create(messages=first, **kwargs)
        content = LEAKY if stream else [{"type": "text", "text": LEAKY}]
        sent = [*first, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": content},
                                             {"type": "text", "text": "Go on."}]}]
        if stream:
            with api.messages.stream(messages=sent, **kwargs) as events:
                text = events.get_final_message().content[0].text
        else:
            text = api.messages.create(messages=sent, **kwargs).content[0].text
    assert text == "noted"
    upstream = scripted.bodies()[-1]["messages"]
    assert upstream[:-1] == sent[:-1]
    clean = secrets_redaction(LEAKY).text
    result, said = upstream[-1]["content"]
    assert result == {**sent[-1]["content"][0], "content": clean if stream else [{"type": "text", "text": clean}]}
    assert said == {"type": "text", "text": "Go on."}
    assert {f["kind"] for f in trail(tks.directory)[call_id]["secrets"]} >= {"aws_access_key", "private_key"}


def test_a_rule_withholds_the_agents_result_and_another_lets_one_through(scripted, tks):
    scripted.script({"tool_calls": [call("read_env", {"path": ".env"}, "c_env"),
                                    call("read_public", {"path": "demo.txt"}, "c_public")]}, {"content": "noted"})
    client = tks.client()
    first = user()
    tools = [function(name) for name in OWN_TOOLS]
    message = client.chat.completions.create(model="m", messages=first, tools=tools).choices[0].message
    sent = [*first, message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "c_env", "content": LEAKY},
            {"role": "tool", "tool_call_id": "c_public", "content": f"the demo key: {ALLOWED}"}]
    assert client.chat.completions.create(model="m", messages=sent, tools=tools).choices[0].message.content == "noted"
    withheld, passed = scripted.bodies()[-1]["messages"][-2:]
    assert withheld["content"].startswith("Withheld by toolkeeper: this result holds secrets (aws_access_key, ")
    assert passed == sent[-1]
    records = trail(tks.directory)
    assert {f["action"] for f in records["c_env"]["secrets"]} == {"block"}
    assert records["c_public"]["secrets"] == [{"kind": "aws_access_key", "where": "result", "action": "allow"}]
    assert ALLOWED not in records["c_public"]["answer"]


def test_a_history_resent_is_redacted_the_same_each_time_and_counted_once(scripted, tks):
    """Every request resends the whole history: the old result is redacted again (the same way, from the digest's
    findings), but it is new only once."""
    call_id = "c_resent"
    before = found_total(tks, "redact", "private_key")
    own_call(scripted, "read_file", call_id)
    client = tks.client()
    first = user()
    tools = [function(name) for name in OWN_TOOLS]
    message = client.chat.completions.create(model="m", messages=first, tools=tools).choices[0].message
    sent = [*first, message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call_id, "content": LEAKY}]
    client.chat.completions.create(model="m", messages=sent, tools=tools)
    redacted = scripted.bodies()[-1]["messages"][2]
    scripted.script({"content": "again"})
    later = [*sent, {"role": "assistant", "content": "noted"}, {"role": "user", "content": "And now?"}]
    assert client.chat.completions.create(model="m", messages=later, tools=tools).choices[0].message.content == "again"
    assert scripted.bodies()[-1]["messages"][2] == redacted
    assert redacted["content"] == secrets_redaction(LEAKY).text
    assert found_total(tks, "redact", "private_key") == before + 1



# -- an MCP server's tool's result, through toolkeeper's MCP proxy --------------------------------------------------

MCP_AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    mcp_servers:
      - name: notes
        command: ["{python}", "{notes}"]
        env: {NOTES_STATE: "{state}"}
        tier: silent
      - name: vault
        command: ["{python}", "{notes}"]
        env: {NOTES_STATE: "{state}"}
        tier: silent
        tools: {echo: {secrets: block}}
"""


def test_an_mcp_servers_result_is_redacted_or_withheld_and_the_trail_keeps_no_secret(tmp_path):
    import asyncio
    import os
    import sys

    from conftest import ROOT
    from mcp import Client, StdioServerParameters

    (tmp_path / "state").mkdir()
    write_agent(tmp_path, MCP_AGENT, notes=str(ROOT / "tests" / "mcp" / "notes_server.py"),
                state=str(tmp_path / "state"))
    text = f"the key is {AWS_KEY}, built from {COMMIT}"

    async def run() -> tuple:
        params = StdioServerParameters(command=sys.executable, args=["-m", "toolkeeper", "mcp",
                                                                     str(tmp_path / "agent.yaml")],
                                       env={"PATH": os.environ["PATH"]}, cwd=tmp_path)
        async with Client(params) as client:
            return (await client.call_tool("mcp__notes__echo", {"text": text}),
                    await client.call_tool("mcp__vault__echo", {"text": text}))

    redacted, withheld = asyncio.run(run())
    clean = f"the key is [REDACTED: aws_access_key], built from {COMMIT}"
    assert not redacted.is_error and [block.text for block in redacted.content] == [clean]
    assert redacted.structured_content == {"echoed": clean}
    assert withheld.is_error and withheld.content[0].text.startswith(
        "Withheld by toolkeeper: this result holds secrets (aws_access_key)")
    kept = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.name.startswith("toolkeeper-audit"))
    assert kept and AWS_KEY.encode() not in kept  # nor in the arguments recorded
    with sqlite3.connect(tmp_path / "toolkeeper-audit.sqlite3") as db:
        bodies = [json.loads(body) for (body,) in db.execute("SELECT body FROM audit_events WHERE kind = 'completed'")]
    assert [(body["tool"], body["secrets"]) for body in bodies] == [
        ("mcp__notes__echo", [{"kind": "aws_access_key", "where": "result.content[0].text", "action": "redact"},
                              {"kind": "aws_access_key", "where": "result.structuredContent.echoed",
                               "action": "redact"}]),
        ("mcp__vault__echo", [{"kind": "aws_access_key", "where": "result.content[0].text", "action": "block"},
                              {"kind": "aws_access_key", "where": "result.structuredContent.echoed",
                               "action": "block"}])]
