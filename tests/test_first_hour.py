"""The first hour of each user: what stops or misleads a newcomer, each with its test (issue: the first hour)."""

from __future__ import annotations

import pytest
from conftest import ROOT, run_cli


# 1. Beyond loopback, a placeholder or short admin token is refused at start.
@pytest.mark.parametrize("token", ["CHANGE-ME", "x", "secret", "a" * 31])
def test_a_placeholder_or_short_admin_token_is_refused_beyond_loopback(token):
    run = run_cli("serve", str(ROOT / "declared" / "example" / "agent.yaml"), "--host", "0.0.0.0", "--port", "0",
                  env={"TOOLKEEPER_ADMIN_TOKEN": token}, timeout=60)
    assert run.returncode == 2 and "TOOLKEEPER_ADMIN_TOKEN is a placeholder or shorter than 32" in run.stderr


def test_a_short_admin_token_stays_fine_on_loopback():
    from toolkeeper.settings import Settings

    assert Settings(host="127.0.0.1", admin_token="short").admin_token == "short"
    assert Settings(host="::1", admin_token="x").host == "::1"


# 10. Small things with a large first impression.
def test_a_mistyped_option_is_said_by_its_command_with_what_was_meant():
    run = run_cli("serve", str(ROOT / "declared" / "example" / "agent.yaml"), "--prot", "9000", timeout=60)
    assert run.returncode == 2
    assert "toolkeeper serve: error: unrecognized arguments: --prot (did you mean --port?)" in run.stderr
    assert "usage: toolkeeper serve" in run.stderr


def test_tokens_revoke_says_what_it_did(tmp_path):
    store = str(tmp_path / "store.sqlite3")
    assert run_cli("tokens", "add", "ada", "--role", "approver", "--store", store).returncode == 0
    run = run_cli("tokens", "revoke", "ada", "--store", store)
    assert run.returncode == 0 and run.stdout.startswith("revoked ada")


def test_the_demo_keeps_a_space_between_the_rounds_text():
    run = run_cli("demo", timeout=120)
    assert run.returncode == 0, run.stderr
    assert "now. Done:" in run.stdout and "now.Done" not in run.stdout


def test_the_tutorials_greet_has_a_verb():
    from toolkeeper.tools.lint import VERBS

    assert "greet" in VERBS
