"""The suite's OpenID provider itself (tests/idp/): oidc-provider as configured there, signed in through its
login form. A broken provider shows here first, not as a mystery in the tests that sign in with it."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import jwt
import pytest
from idp import (
    ACCESS_TOKEN_TYPE,
    AGENTS,
    CONSOLE,
    CONSOLE_SECRET,
    TOKEN_EXCHANGE,
    Browser,
    LoginRefused,
    OIDCError,
)

MCP = "http://127.0.0.1:9/mcp"


def header(token: str) -> dict:
    return jwt.get_unverified_header(token)


def test_discovery_advertises_what_the_suite_uses(oidc_provider):
    meta = oidc_provider.metadata()
    issuer = oidc_provider.issuer
    assert issuer.startswith("http://127.0.0.1:")
    assert meta["issuer"] == issuer
    for endpoint in ("authorization_endpoint", "token_endpoint", "jwks_uri", "end_session_endpoint",
                     "registration_endpoint", "userinfo_endpoint"):
        assert meta[endpoint].startswith(issuer + "/"), endpoint
    assert meta["code_challenge_methods_supported"] == ["S256"]
    assert {"authorization_code", "refresh_token", "client_credentials", TOKEN_EXCHANGE} <= set(
        meta["grant_types_supported"])
    assert {"openid", "profile", "email", "groups", "offline_access"} <= set(meta["scopes_supported"])
    assert meta["response_types_supported"] == ["code"]
    assert {"client_secret_basic", "client_secret_post", "none"} <= set(meta["token_endpoint_auth_methods_supported"])
    keys = oidc_provider.jwks()["keys"]
    assert {(k["kty"], k["alg"]) for k in keys} == {("RSA", "RS256"), ("EC", "ES256")}
    assert not any("d" in k for k in keys), "private parts published"


def test_code_flow_gives_an_id_token_with_the_users_groups(oidc_provider):
    flow = oidc_provider.login_code_flow("ada")
    answer = oidc_provider.tokens(flow)
    assert answer["token_type"] == "Bearer"
    assert answer["refresh_token"], "the console always gets a refresh token"
    # verified with PyJWT against the published JWKS
    keys = jwt.PyJWKClient(oidc_provider.metadata()["jwks_uri"], cache_jwk_set=False)
    claims = jwt.decode(answer["id_token"], keys.get_signing_key_from_jwt(answer["id_token"]).key,
                        algorithms=["RS256"], audience=CONSOLE, issuer=oidc_provider.issuer)
    assert claims["sub"] == "ada"
    assert claims["groups"] == ["platform", "approvers"]
    assert claims["name"] == "Ada Lovelace"
    assert claims["preferred_username"] == "ada"
    assert claims["email"] == "ada@example.com"
    assert claims["email_verified"] is True
    assert claims["nonce"] == flow.nonce
    assert 590 <= claims["exp"] - claims["iat"] <= 600
    assert header(answer["id_token"])["kid"] == oidc_provider.ready["kid"]
    # the opaque access token (no resource) is good at userinfo
    assert oidc_provider.userinfo(answer["access_token"])["groups"] == ["platform", "approvers"]


def test_scopes_decide_the_id_tokens_claims(oidc_provider):
    claims = oidc_provider.decode(oidc_provider.password_tokens("grace", scope="openid email")["id_token"])
    assert claims["email"] == "grace@example.com"
    assert "groups" not in claims
    assert "name" not in claims


def test_a_wrong_password_shows_the_form_again(oidc_provider):
    with pytest.raises(LoginRefused, match="Invalid login or password"):
        oidc_provider.login_code_flow("ada", "grace-password")
    with pytest.raises(LoginRefused):
        oidc_provider.login_code_flow("mallory", "mallory-password")


def test_a_code_is_good_once(oidc_provider):
    flow = oidc_provider.login_code_flow("linus")
    assert oidc_provider.tokens(flow)["access_token"]
    with pytest.raises(OIDCError) as replay:
        oidc_provider.tokens(flow)
    assert replay.value.error == "invalid_grant"
    assert replay.value.status == 400


def test_pkce_is_required(oidc_provider):
    url, flow = oidc_provider.authorization_url()
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    del query["code_challenge"], query["code_challenge_method"]
    final = oidc_provider.follow_login(url.split("?")[0] + "?" + urllib.parse.urlencode(query), "ada")
    answer = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(final).query))
    assert final.startswith(flow.redirect_uri)
    assert answer["error"] == "invalid_request"
    assert "PKCE" in answer["error_description"]
    # and the verifier must match
    flow = oidc_provider.login_code_flow("ada")
    with pytest.raises(OIDCError) as wrong:
        oidc_provider.tokens(flow, code_verifier="x" * 50)
    assert wrong.value.error == "invalid_grant"


def test_a_secret_in_the_body_is_accepted_too(oidc_provider):
    flow = oidc_provider.login_code_flow("bob")
    assert oidc_provider.tokens(flow, auth="post")["id_token"]
    with pytest.raises(OIDCError) as refused:
        oidc_provider.tokens(oidc_provider.login_code_flow("bob"), client_secret="not-the-secret")
    assert refused.value.error == "invalid_client"


def test_a_resource_gives_a_jwt_access_token_for_it(oidc_provider):
    answer = oidc_provider.password_tokens("ada", resource=MCP)
    token = answer["access_token"]
    assert header(token)["typ"] == "at+jwt"
    assert header(token)["alg"] == "RS256"
    claims = oidc_provider.decode(token, audience=MCP)
    assert claims["aud"] == MCP
    assert claims["sub"] == "ada"
    assert claims["client_id"] == CONSOLE
    assert claims["groups"] == ["platform", "approvers"]
    assert claims["email"] == "ada@example.com"
    assert 590 <= claims["exp"] - claims["iat"] <= 600
    # the ID token is still for the client, and a refresh keeps the resource
    assert oidc_provider.decode(answer["id_token"], audience=CONSOLE)["sub"] == "ada"
    refreshed = oidc_provider.refresh(answer["refresh_token"])
    assert oidc_provider.decode(refreshed["access_token"], audience=MCP)["aud"] == MCP


def test_a_resource_elsewhere_is_refused(oidc_provider):
    with pytest.raises(OIDCError) as refused:
        oidc_provider.login_code_flow("ada", resource="https://example.com/api")
    assert refused.value.error == "invalid_target"


def test_client_credentials(oidc_provider):
    answer = oidc_provider.client_credentials(resource=MCP)
    claims = oidc_provider.decode(answer["access_token"], audience=MCP)
    assert claims["sub"] == AGENTS
    assert claims["client_id"] == AGENTS
    assert answer["expires_in"] == 600
    with pytest.raises(OIDCError) as refused:  # the console may not use the grant
        oidc_provider.client_credentials(client_id=CONSOLE, resource=MCP)
    assert refused.value.error in ("invalid_request", "unauthorized_client")


def test_token_exchange(oidc_provider):
    subject = oidc_provider.password_tokens("ada", resource=MCP)["access_token"]
    target = "http://127.0.0.1:9/tools"
    answer = oidc_provider.token_exchange(subject, resource=target)
    assert answer["issued_token_type"] == ACCESS_TOKEN_TYPE
    assert answer["token_type"] == "Bearer"
    assert answer["expires_in"] == 600
    claims = oidc_provider.decode(answer["access_token"], audience=target)
    assert claims["aud"] == target
    assert claims["sub"] == "ada"
    assert claims["act"] == {"sub": AGENTS}
    assert claims["groups"] == ["platform", "approvers"]
    assert claims["email"] == "ada@example.com"
    assert claims["iss"] == oidc_provider.issuer
    assert header(answer["access_token"])["kid"] == oidc_provider.ready["kid"]
    # an exchanged token can be exchanged again: the earlier actor is kept, nested
    again = oidc_provider.token_exchange(answer["access_token"], audience="tools-backend")
    assert oidc_provider.decode(again["access_token"], audience="tools-backend")["act"] == {
        "sub": AGENTS, "act": {"sub": AGENTS}}


def test_token_exchange_refuses_what_it_did_not_issue(oidc_provider):
    now = int(time.time())
    base = {"iss": oidc_provider.issuer, "sub": "ada", "aud": MCP, "iat": now}
    expired = oidc_provider.sign({**base, "exp": now - 60}, header={"typ": "at+jwt"})
    foreign = oidc_provider.sign({**base, "iss": "http://127.0.0.1:1", "exp": now + 60}, header={"typ": "at+jwt"})
    id_token = oidc_provider.password_tokens("ada")["id_token"]  # not an access token
    for token in (expired, foreign, id_token, "not-a-jwt"):
        with pytest.raises(OIDCError) as refused:
            oidc_provider.token_exchange(token, resource=MCP)
        assert refused.value.error == "invalid_grant", token
    good = oidc_provider.sign({**base, "exp": now + 60}, header={"typ": "at+jwt"})
    with pytest.raises(OIDCError) as refused:
        oidc_provider.token_exchange(good, resource=MCP, subject_token_type="urn:x:other")
    assert refused.value.error == "invalid_request"
    with pytest.raises(OIDCError) as refused:
        oidc_provider.token_exchange(good)  # no resource or audience
    assert refused.value.error == "invalid_request"
    with pytest.raises(OIDCError) as refused:  # the console may not exchange tokens
        oidc_provider.token_exchange(good, resource=MCP, client_id=CONSOLE)
    assert refused.value.error in ("invalid_request", "unauthorized_client")
    assert oidc_provider.token_exchange(good, resource=MCP)["access_token"]


def test_sign_signs_with_either_key(oidc_provider):
    now = int(time.time())
    for alg in ("RS256", "ES256"):
        token = oidc_provider.sign({"iss": oidc_provider.issuer, "sub": "x", "exp": now + 60}, alg=alg,
                                   header={"typ": "JWT"})
        assert header(token)["alg"] == alg
        assert header(token)["typ"] == "JWT"
        assert oidc_provider.decode(token)["sub"] == "x"
    expired = oidc_provider.sign({"iss": oidc_provider.issuer, "exp": now - 60})
    with pytest.raises(jwt.ExpiredSignatureError):
        oidc_provider.decode(expired)


def test_rotation_changes_the_signing_key(fresh_oidc_provider):
    idp = fresh_oidc_provider
    old = idp.ready["kid"]
    before = idp.password_tokens("ada", resource=MCP)
    new = idp.rotate_keys()
    assert new != old
    kids = [k["kid"] for k in idp.jwks()["keys"]]
    assert new in kids
    assert old in kids
    after = idp.password_tokens("ada", resource=MCP)
    assert header(after["id_token"])["kid"] == new
    assert header(after["access_token"])["kid"] == new
    assert idp.decode(before["id_token"], audience=CONSOLE)["sub"] == "ada"  # still verifiable
    # tokens from before the rotation still refresh, and come back signed with the new key
    assert header(idp.refresh(before["refresh_token"])["id_token"])["kid"] == new
    newest = idp.rotate_keys(drop_old=True)
    kids = [k["kid"] for k in idp.jwks()["keys"]]
    assert newest in kids
    assert old not in kids
    assert new not in kids
    with pytest.raises(jwt.PyJWKClientError):
        idp.decode(before["id_token"], audience=CONSOLE)


def test_changed_groups_show_after_a_refresh(fresh_oidc_provider):
    idp = fresh_oidc_provider
    answer = idp.password_tokens("ada", resource=MCP)
    assert idp.decode(answer["id_token"])["groups"] == ["platform", "approvers"]
    idp.set_groups("ada", ["visitors"])
    refreshed = idp.refresh(answer["refresh_token"])
    assert idp.decode(refreshed["id_token"], audience=CONSOLE)["groups"] == ["visitors"]
    assert idp.decode(refreshed["access_token"], audience=MCP)["groups"] == ["visitors"]
    assert idp.decode(idp.password_tokens("ada")["id_token"])["groups"] == ["visitors"]


def test_redirect_uris_can_change(oidc_provider):
    uri = "http://127.0.0.1:19/console/callback"
    with pytest.raises(OIDCError):  # not registered yet: an error page, no redirect
        oidc_provider.login_code_flow("ada", redirect_uri=uri)
    oidc_provider.set_redirects(CONSOLE, [uri, "http://localhost:19/cb"])
    try:
        flow = oidc_provider.login_code_flow("ada", redirect_uri=uri)
        assert flow.url.startswith(uri + "?")
        assert oidc_provider.tokens(flow, client_secret=CONSOLE_SECRET)["id_token"]
    finally:
        oidc_provider.set_redirects(CONSOLE, oidc_provider.redirect_uris)


def test_dynamic_registration_of_a_public_client(oidc_provider):
    redirect = "http://127.0.0.1:33418/oauth/callback"
    client = oidc_provider.register_client({
        "client_name": "an MCP client", "redirect_uris": [redirect], "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
    })
    assert client["client_id"]
    assert "client_secret" not in client
    assert client["token_endpoint_auth_method"] == "none"
    # it signs users in, public (PKCE alone), and gets a token for a resource
    flow = oidc_provider.login_code_flow("grace", client_id=client["client_id"], redirect_uri=redirect,
                                         resource=MCP)
    answer = oidc_provider.tokens(flow)
    claims = oidc_provider.decode(answer["access_token"], audience=MCP)
    assert claims["client_id"] == client["client_id"]
    assert claims["groups"] == ["auditors"]
    assert answer["refresh_token"]


def test_an_oauth_client_as_the_mcp_sdk_is(oidc_provider):
    """Discovery at RFC 8414's address, a confidential client registered, the scopes the provider advertises
    asked for (the SDK's fallback), the resource named at both endpoints, the secret in the body."""
    meta = oidc_provider.metadata()
    with urllib.request.urlopen(oidc_provider.issuer + "/.well-known/oauth-authorization-server") as answer:
        assert json.loads(answer.read()) == meta
    redirect = "http://localhost:3030/callback"
    client = oidc_provider.register_client({"redirect_uris": [redirect], "token_endpoint_auth_method": "client_secret_post",
                                            "grant_types": ["authorization_code", "refresh_token"]})
    flow = oidc_provider.login_code_flow("linus", client_id=client["client_id"], redirect_uri=redirect,
                                         scope=" ".join(meta["scopes_supported"]), resource=MCP)
    answer = oidc_provider.tokens(flow, client_secret=client["client_secret"], auth="post", resource=MCP)
    assert oidc_provider.decode(answer["access_token"], audience=MCP)["groups"] == ["approvers"]
    assert set(answer["scope"].split()) <= set(meta["scopes_supported"])
    refreshed = oidc_provider.refresh(answer["refresh_token"], client_id=client["client_id"],
                                      client_secret=client["client_secret"])
    assert oidc_provider.decode(refreshed["access_token"], audience=MCP)["sub"] == "linus"
    # and a plain OAuth request (no openid: no nonce, no ID token) works too
    plain = oidc_provider.tokens(oidc_provider.login_code_flow(
        "linus", client_id=client["client_id"], redirect_uri=redirect, scope="groups", resource=MCP),
        client_secret=client["client_secret"])
    assert "id_token" not in plain
    assert oidc_provider.decode(plain["access_token"], audience=MCP)["scope"] == "groups"


def test_follow_login_with_an_url_built_elsewhere(oidc_provider):
    url, flow = oidc_provider.authorization_url(scope="openid groups")
    final = oidc_provider.follow_login(url, "linus")
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(final).query))
    assert final.startswith(flow.redirect_uri)
    assert query["state"] == flow.state
    assert query["iss"] == oidc_provider.issuer
    assert oidc_provider.tokens(query["code"], code_verifier=flow.code_verifier)["id_token"]


def test_logout(oidc_provider):
    url, flow = oidc_provider.authorization_url()
    browser = Browser()
    final = browser.sign_in(url, "ada", "ada-password", lambda u: u.startswith(flow.redirect_uri))
    code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(final).query))["code"]
    answer = oidc_provider.tokens(code, code_verifier=flow.code_verifier)
    back = "http://127.0.0.1:9/"  # an origin of a redirect URI is a post-logout one too
    end = oidc_provider.metadata()["end_session_endpoint"] + "?" + urllib.parse.urlencode(
        {"id_token_hint": answer["id_token"], "post_logout_redirect_uri": back, "state": "bye"})
    status, _, page = browser.open(end)
    assert status == 200
    assert "document.getElementById('submit').click()" in page  # a browser signs out at once
    (form,) = Browser.forms(page)
    status, headers, _ = browser.open(urllib.parse.urljoin(end, form["action"]), {**form["fields"], "logout": "yes"})
    assert status in (302, 303)
    assert headers["Location"] == back + "?state=bye"
    # the refresh token (no offline_access) ended with the session
    with pytest.raises(OIDCError) as ended:
        oidc_provider.refresh(answer["refresh_token"])
    assert ended.value.error == "invalid_grant"
