"""Agents that present a JWT from the company's provider: who each call is for, to the rules and the record.

The provider is the real one (tests/idp: npm's oidc-provider); the agents are the `openai` and `anthropic` SDKs
with the token as their API key; toolkeeper is a real `serve`. Every token a check must refuse (another key,
`alg: none`, expired, another audience, another issuer) is a 401 in the API's own error shape; an issuer that
cannot be reached is a 503, never a call let through.
"""

from __future__ import annotations

import base64
import json
import time

import anthropic
import jwt
import openai
import pytest
from conftest import YOLO, audit_cli, call, free_port, fresh, recording_tool, serving, user, write_agent
from cryptography.hazmat.primitives.asymmetric import rsa

AUDIENCE = "http://127.0.0.1/toolkeeper-agents"  # the provider accepts any loopback resource URL
RULES = """
rules:
  - id: only-platform-releases
    effect: deny
    reason: Only the platform group may release.
    when:
      tool: release
      principal: {groups: {none: [platform]}}
  - id: ada-never-looks-up-secrets
    effect: deny
    reason: Not for this user.
    when:
      tool: lookup
      principal: {user: {equals: ada}}
      arguments: {word: {equals: secret}}
"""
AGENT = YOLO + recording_tool("release", "version", "Publish a release.", "The version.") + recording_tool(
    "lookup", "word", "Look a word up.", "The word.")


def jwt_agent_serve(scripted, directory, issuer: str, *extra: str):
    write_agent(directory, AGENT)
    (directory / "rules.yaml").write_text(RULES)
    return serving(scripted, directory, "--policy", str(directory / "rules.yaml"),
                   "--auth-agents-jwt-issuer", issuer, "--auth-agents-jwt-audience", AUDIENCE,
                   "--auth-agents-jwt-claims", "email", *extra)


@pytest.fixture(scope="module")
def jwt_served(scripted, oidc_provider, tmp_path_factory):
    with jwt_agent_serve(scripted, tmp_path_factory.mktemp("jwt"), oidc_provider.issuer) as running:
        yield running


@pytest.fixture
def tkj(jwt_served):
    yield from fresh(jwt_served)


def token_for(provider, name: str) -> str:
    return provider.password_tokens(name, resource=AUDIENCE)["access_token"]


def trail(tk, *args: str) -> list[dict]:
    run = audit_cli(tk.directory / "toolkeeper-audit.sqlite3", "export", *args)
    return [json.loads(line) for line in run.stdout.splitlines()]


def results(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def test_a_group_rule_decides_a_jwt_agents_call_and_the_record_names_the_user(scripted, tkj, oidc_provider):
    for name, ran in (("ada", True), ("bob", False)):
        tkj.reset()
        scripted.script({"tool_calls": [call("release", {"version": "1.0.0"})]}, {"content": "done"})
        tkj.client(api_key=token_for(oidc_provider, name)).chat.completions.create(model="m", messages=user())
        assert (tkj.calls() == [["release", "1.0.0"]]) is ran
        if not ran:
            assert "Only the platform group may release." in results(scripted.bodies()[-1])[0]
    records = trail(tkj, "--tool", "release")
    by_user = {r["policy_input"]["principal"]["user"]: r for r in records}
    ada, bob = by_user["ada"], by_user["bob"]
    assert ada["status"] == "ok" and bob["status"] == "denied" and bob["decision_rule"] == "only-platform-releases"
    assert ada["policy_input"]["principal"]["groups"] == ["platform", "approvers"]
    assert ada["policy_input"]["principal"]["issuer"] == oidc_provider.issuer
    assert ada["policy_input"]["principal"]["claims"] == {"email": "ada@example.com"}  # only the listed claim
    assert ada["agent"] == "toolkeeper-console"  # the token's client names the agent
    assert "eyJ" not in json.dumps(records)  # never the token itself


def test_a_rule_on_the_user_and_the_trail_by_user(scripted, tkj, oidc_provider):
    tkj.reset()
    scripted.script({"tool_calls": [call("lookup", {"word": "secret"})]}, {"content": "done"})
    tkj.client(api_key=token_for(oidc_provider, "ada")).chat.completions.create(model="m", messages=user())
    assert tkj.calls() == [] and "Not for this user." in results(scripted.bodies()[-1])[0]
    scripted.script({"tool_calls": [call("lookup", {"word": "secret"})]}, {"content": "done"})
    tkj.client(api_key=token_for(oidc_provider, "linus")).chat.completions.create(model="m", messages=user())
    assert tkj.calls() == [["lookup", "secret"]]
    assert {r["status"] for r in trail(tkj, "--tool", "lookup", "--user", "ada")} == {"denied"}
    assert {r["status"] for r in trail(tkj, "--tool", "lookup", "--user", "linus")} == {"ok"}


def forged(provider, **changes) -> str:
    now = int(time.time())
    claims = {"iss": provider.issuer, "aud": AUDIENCE, "sub": "ada", "client_id": "forged", "groups": ["platform"],
              "iat": now, "exp": now + 600, **changes}
    return provider.sign({k: v for k, v in claims.items() if v is not None})


def unsigned(provider) -> str:
    header = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode()
    now = int(time.time())
    body = json.dumps({"iss": provider.issuer, "aud": AUDIENCE, "sub": "ada", "groups": ["platform"],
                       "exp": now + 600}).encode()
    return f"{header}.{base64.urlsafe_b64encode(body).rstrip(b'=').decode()}."


def other_key(provider) -> str:
    """Signed by a key of the attacker's, under the provider's own key id: the signature must not verify."""
    kid = provider.jwks()["keys"][0]["kid"]
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    return jwt.encode({"iss": provider.issuer, "aud": AUDIENCE, "sub": "ada", "groups": ["platform"],
                       "iat": now, "exp": now + 600}, private, algorithm="RS256", headers={"kid": kid})


BAD_TOKENS = {
    "another key": (other_key, "signature does not verify"),
    "alg none": (unsigned, "not one of the accepted algorithms"),
    "expired": (lambda p: forged(p, exp=int(time.time()) - 3600, iat=int(time.time()) - 7200), "expired"),
    "another audience": (lambda p: forged(p, aud="http://127.0.0.1/another-service"), "another audience"),
    "another issuer": (lambda p: forged(p, iss="http://127.0.0.1:9"), "not issued by"),
    "no user": (lambda p: forged(p, sub=None), "naming the user"),
    "HS256 with the public key": (lambda p: jwt.encode({"iss": p.issuer, "aud": AUDIENCE, "sub": "ada",
                                                        "exp": int(time.time()) + 600}, "k" * 32,
                                                       algorithm="HS256"), "not one of the accepted"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
def test_a_bad_token_is_a_401_in_each_apis_shape_and_nothing_runs(scripted, tkj, oidc_provider, case):
    make, said = BAD_TOKENS[case]
    token = make(oidc_provider)
    tkj.reset()
    scripted.script({"tool_calls": [call("release", {"version": "9.9.9"})]}, {"content": "done"})
    before = len(scripted.requests())
    with pytest.raises(openai.AuthenticationError) as chat:
        tkj.client(api_key=token).chat.completions.create(model="m", messages=user())
    assert said in chat.value.body["message"] and chat.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        tkj.client(api_key=token).responses.create(model="m", input="hi")
    with anthropic.Anthropic(base_url=tkj.base_url[:-3], api_key=token, max_retries=0) as client, \
            pytest.raises(anthropic.AuthenticationError) as messages:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert messages.value.body["type"] == "error" and said in messages.value.body["error"]["message"]
    assert len(scripted.requests()) == before and tkj.calls() == []  # nothing went on to the model
    scripted.script()


def test_no_token_at_all_is_refused_once_jwt_agents_are_on(scripted, tkj):
    with pytest.raises(openai.AuthenticationError) as refused:
        tkj.client(api_key="sk-not-a-listed-key").chat.completions.create(model="m", messages=user())
    assert "present a token from its issuer" in refused.value.body["message"]


def test_an_issuer_that_is_down_fails_closed_with_a_503(scripted, tmp_path, oidc_provider):
    token = token_for(oidc_provider, "ada")  # a good token, but toolkeeper's issuer cannot be reached
    down = f"http://127.0.0.1:{free_port()}"
    with jwt_agent_serve(scripted, tmp_path, down) as tk:
        with pytest.raises(openai.InternalServerError) as refused:
            tk.client(api_key=forged_like(token, down)).chat.completions.create(model="m", messages=user())
        assert refused.value.status_code == 503 and "did not answer" in refused.value.body["message"]
        assert tk.calls() == []
        tk.close_clients()


def forged_like(token: str, issuer: str) -> str:
    """The token's claims under another issuer's name (the signature is beside the point: it is never reached)."""
    header, body, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["iss"] = issuer
    encoded = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{encoded}.{signature}"


def test_keys_rotated_at_the_provider_are_picked_up(scripted, tmp_path, fresh_oidc_provider):
    provider = fresh_oidc_provider
    with jwt_agent_serve(scripted, tmp_path, provider.issuer) as tk:
        scripted.script({"content": "first"})
        tk.client(api_key=token_for(provider, "ada")).chat.completions.create(model="m", messages=user())
        new_kid = provider.rotate_keys(drop_old=True)
        token = token_for(provider, "ada")
        assert jwt.get_unverified_header(token)["kid"] == new_kid
        scripted.script({"content": "after the rotation"})
        answer = tk.client(api_key=token).chat.completions.create(model="m", messages=user())
        assert answer.choices[0].message.content == "after the rotation"
        tk.close_clients()


def test_serve_refuses_to_start_without_an_audience(tmp_path, oidc_provider):
    from conftest import run_cli

    write_agent(tmp_path, AGENT)
    run = run_cli("serve", str(tmp_path / "agent.yaml"), "--port", "0", "--auth-agents-jwt-issuer",
                  oidc_provider.issuer, timeout=30)
    assert run.returncode != 0 and "needs an audience" in run.stderr


def test_the_identity_header_is_believed_only_from_a_trusted_proxy(scripted, tmp_path):
    import urllib.error
    import urllib.request

    write_agent(tmp_path, AGENT)
    forwarded = {"X-Forwarded-User": "ada"}
    with serving(scripted, tmp_path, "--identity-header", "X-Forwarded-User", "--trusted-proxy", "10.0.0.0/8") as tk:
        with pytest.raises(openai.PermissionDeniedError) as refused:  # 127.0.0.1 is not a trusted proxy here
            tk.client(default_headers=forwarded).chat.completions.create(model="m", messages=user())
        assert "only believed from a trusted proxy" in refused.value.body["message"]
        hook = urllib.request.Request(tk.base_url[:-3] + "/toolkeeper/hooks", data=b"{}", headers=forwarded)
        with pytest.raises(urllib.error.HTTPError) as door:  # the hooks door refuses it as well
            urllib.request.urlopen(hook, timeout=10)
        assert door.value.code == 403
        door.value.close()
        scripted.script({"content": "no header, no question"})
        assert tk.client().chat.completions.create(model="m", messages=user()).choices[0].message.content
        tk.close_clients()
    with serving(scripted, tmp_path, "--identity-header", "X-Forwarded-User") as tk:  # loopback: trusted
        scripted.script({"tool_calls": [call("lookup", {"word": "w"})]}, {"content": "done"})
        tk.client(default_headers=forwarded).chat.completions.create(model="m", messages=user())
        (record,) = trail(tk, "--tool", "lookup")
        assert record["policy_input"]["principal"]["user"] == "ada"
        assert record["policy_input"]["agent"]["header"] == "ada" and record["policy_input"]["principal"]["issuer"] is None
        tk.close_clients()


def test_the_how_tos_config_is_one_serve_reads(tmp_path):
    """docs/how-to/sign-in-with-your-identity-provider.md's config block, every key a setting (nested groups and
    the role mapping included), checked as serve checks it."""
    import re

    from conftest import ROOT

    from toolkeeper.identity import build_identity
    from toolkeeper.identity.setup import role_mapping
    from toolkeeper.settings import Settings, read_config, typed

    page = (ROOT / "docs" / "how-to" / "sign-in-with-your-identity-provider.md").read_text()
    block = re.search(r"```yaml file=toolkeeper.yaml\n(.*?)```", page, re.S).group(1)
    (tmp_path / "secret").write_text("console-secret-0123456789abcdef\n")
    (tmp_path / "toolkeeper.yaml").write_text(block.replace("/run/secrets/oidc-client-secret",
                                                            str(tmp_path / "secret")))
    values = read_config(str(tmp_path / "toolkeeper.yaml"))
    settings = Settings(**{name: typed(name, value) for name, value in values.items()})
    assert settings.auth_oidc_client_secret == "console-secret-0123456789abcdef"
    assert role_mapping(settings.auth_oidc_roles) == {"platform": {"admin"}, "approvers": {"approver"},
                                                      "auditors": {"auditor"}}
    assert settings.auth_tokens == "automation-only" and settings.auth_agents_jwt_claims == ("email",)
    identity = build_identity(settings)
    assert identity.mcp_resource == "http://127.0.0.1:8787/mcp"
    assert identity.agents.audiences == ("http://127.0.0.1/toolkeeper-agents",)


def test_a_conversation_outlives_the_users_access_token(scripted, tkj, oidc_provider):
    """A Responses chain goes on when the agent refreshes its token: the stored history is the user's, not the
    token's; another user cannot continue it."""
    scripted.script({"tool_calls": [call("lookup", {"word": "first"})]}, {"content": "first answer"})
    first = tkj.client(api_key=token_for(oidc_provider, "ada")).responses.create(model="m", input="one")
    scripted.script({"content": "second answer"})
    second = tkj.client(api_key=token_for(oidc_provider, "ada")).responses.create(
        model="m", input="two", previous_response_id=first.id)
    assert second.output_text == "second answer"
    assert scripted.bodies()[0]["previous_response_id"] != first.id  # the hidden round's id, restored
    scripted.script({"content": "not for linus"})
    with pytest.raises(openai.APIStatusError):
        tkj.client(api_key=token_for(oidc_provider, "linus")).responses.create(
            model="m", input="three", previous_response_id=first.id)
    scripted.script()


def test_a_token_with_many_groups_is_read_and_one_past_the_bound_refused(scripted, tkj, oidc_provider):
    """A company's token with hundreds of groups is longer than a web server's usual 8 KiB header: it is read; one
    past toolkeeper's own 16 KiB bound is a 401 that says so, in the API's shape."""
    groups = ["platform", *(f"team-{index:04d}-with-a-long-name" for index in range(300))]
    token = forged(oidc_provider, groups=groups)
    assert 8 * 1024 < len(token) < 16 * 1024
    scripted.script({"tool_calls": [call("release", {"version": "2.0.0"})]}, {"content": "done"})
    tkj.client(api_key=token).chat.completions.create(model="m", messages=user())
    assert tkj.calls() == [["release", "2.0.0"]]
    huge = forged(oidc_provider, groups=[*groups, *(f"more-{index:05d}-of-them" for index in range(190))])
    assert 16 * 1024 < len(huge) < 20 * 1024  # within what the server reads, past what toolkeeper checks
    with pytest.raises(openai.AuthenticationError) as refused:
        tkj.client(api_key=huge).chat.completions.create(model="m", messages=user())
    assert "longer than any toolkeeper accepts" in refused.value.body["message"]
    scripted.script()
