"""The first hour of each user: what stops or misleads a newcomer, each with its test (issue: the first hour)."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT, STANDARD_AGENT, Process, free_port, run_cli, write_agent


# 1. Beyond loopback, a placeholder or short admin token is refused at start.
@pytest.mark.parametrize("token", ["CHANGE-ME", "x", "secret", "a" * 31])
def test_a_placeholder_or_short_admin_token_is_refused_beyond_loopback(token):
    run = run_cli("serve", str(ROOT / "declared" / "example" / "agent.yaml"), "--host", "0.0.0.0", "--port", "0",
                  env={"TOOLKEEPER_ADMIN_TOKEN": token}, timeout=60)
    assert run.returncode == 2 and "TOOLKEEPER_ADMIN_TOKEN is a placeholder or shorter than 32" in run.stderr


def test_a_short_admin_token_stays_fine_on_loopback_and_for_the_commands_that_listen_on_nothing(tmp_path):
    from toolkeeper.settings import Settings

    Settings(host="127.0.0.1", admin_token="short").check_exposure()
    Settings(host="::1", admin_token="x").check_exposure()
    store = str(tmp_path / "store.sqlite3")
    listed = run_cli("tokens", "list", "--store", store, env={"TOOLKEEPER_HOST": "0.0.0.0",
                                                              "TOOLKEEPER_ADMIN_TOKEN": "short"})
    assert "placeholder" not in listed.stderr and "no store at" in listed.stderr


# 5. Every command finds the server it belongs to: one config file (or the same TOOLKEEPER_* variables) for all.
def test_one_config_file_serves_every_command(tmp_path):
    agent = write_agent(tmp_path, STANDARD_AGENT, pids=str(tmp_path / "pids"))
    (tmp_path / "admin-token").write_text("t" * 40 + "\n")
    config = tmp_path / "toolkeeper.yaml"
    config.write_text(f"agent_file: {agent}\nport: {free_port()}\nadmin_token_file: {tmp_path / 'admin-token'}\n"
                      "upstream: http://127.0.0.1:9\nconsent: approvals\n")
    elsewhere = tmp_path / "elsewhere"  # none of the commands runs in the agent file's directory
    elsewhere.mkdir()

    # before the first serve: tokens add makes the store serve will use, next to the agent file
    added = run_cli("tokens", "add", "ada", "--role", "approver", "--config", str(config), cwd=elsewhere)
    assert added.returncode == 0, added.stderr
    assert (tmp_path / "toolkeeper.sqlite3").exists()
    server = Process([sys.executable, "-m", "toolkeeper", "serve", "--config", str(config)], "toolkeeper listening on",
                     cwd=elsewhere)
    try:
        by_flag = run_cli("approvals", "--config", str(config), cwd=elsewhere)
        by_variable = run_cli("approvals", cwd=elsewhere, env={"TOOLKEEPER_CONFIG": str(config)})
        trail = run_cli("audit", "list", "--config", str(config), cwd=elsewhere)
        tokens = run_cli("tokens", "list", cwd=elsewhere, env={"TOOLKEEPER_AGENT_FILE": str(agent)})
    finally:
        server.stop()
    assert by_flag.returncode == 0 and by_flag.stdout.strip() == "nothing waits for approval", by_flag.stderr
    assert by_variable.returncode == 0 and by_variable.stdout.strip() == "nothing waits for approval"
    assert trail.returncode == 0, trail.stderr
    assert tokens.returncode == 0 and tokens.stdout.startswith("ada  approver")
    assert not list(elsewhere.iterdir())  # nothing was made where the commands ran


def test_a_command_that_cannot_find_serve_says_how_to_name_it(tmp_path):
    config = tmp_path / "toolkeeper.yaml"
    config.write_text(f"port: {free_port()}\n")
    unreachable = run_cli("approvals", "--config", str(config), cwd=tmp_path)
    assert unreachable.returncode == 1 and "cannot reach http://127.0.0.1:" in unreachable.stderr
    assert "--config" in unreachable.stderr
    no_trail = run_cli("audit", "list", cwd=tmp_path)
    assert no_trail.returncode == 2 and "--agent-file" in no_trail.stderr
    broken = run_cli("audit", "list", "--config", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert broken.returncode == 2 and "cannot read the config file" in broken.stderr


def test_serve_without_an_agent_file_says_where_one_may_come_from():
    run = run_cli("serve", timeout=60)
    assert run.returncode == 2 and "serve needs the agent file" in run.stderr


def test_serve_given_two_agent_files_refuses_rather_than_pick_one(tmp_path):
    run = run_cli("serve", str(ROOT / "declared" / "example" / "agent.yaml"), "--port", "0", timeout=60,
                  env={"TOOLKEEPER_AGENT_FILE": str(tmp_path / "agent.yaml")})
    assert run.returncode == 2 and "two agent files" in run.stderr


def test_the_address_the_commands_reach_is_serves_with_a_wildcard_as_loopback():
    from toolkeeper.settings import Settings

    assert Settings(host="0.0.0.0", port=9000).local_url == "http://127.0.0.1:9000"
    assert Settings(host="[::1]", port=9000).local_url == "http://[::1]:9000"
    assert Settings(host="::", port=9000).local_url == "http://[::1]:9000"


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
