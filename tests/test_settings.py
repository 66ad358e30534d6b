"""Each setting is declared once: the flags come from `Settings`, and the reference lists every one."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import fields

import pytest
from conftest import ROOT

from toolkeeper.settings import Settings, SettingsError


def test_every_setting_is_a_flag_and_documented():
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    reference = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for setting in fields(Settings):
        flag = "--" + setting.name.replace("_", "-")
        if setting.metadata["flag"]:
            assert any(flag in action.option_strings for action in parser._actions), flag
            assert f"`{flag}" in reference, f"{flag} is missing from docs/reference/cli.md"


def test_flags_make_the_settings_and_the_token_comes_from_the_environment():
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    arguments = parser.parse_args(["--port", "0", "--allow-origin", "https://a.example", "--allow-origin",
                                   "https://b.example", "--read-timeout", "2.5"])
    settings = Settings.from_arguments(arguments, environ={"TOOLKEEPER_ADMIN_TOKEN": "t0ken"})
    assert (settings.port, settings.read_timeout, settings.admin_token) == (0, 2.5, "t0ken")
    assert settings.allow_origin == ("https://a.example", "https://b.example") and settings.redact == ()


def settings_from(argv: list[str], environ: dict[str, str]) -> Settings:
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    return Settings.from_arguments(parser.parse_args(argv), environ=environ)


def test_flags_win_over_the_environment_which_wins_over_the_config_file(tmp_path):
    config = tmp_path / "toolkeeper.yaml"
    config.write_text("port: 9000\nread-timeout: 30\nkeepalive: 2\nallow_origin: [https://file.example]\n"
                      "consent: none\n")
    environ = {"TOOLKEEPER_READ_TIMEOUT": "40", "TOOLKEEPER_KEEPALIVE": "3",
               "TOOLKEEPER_ALLOW_ORIGIN": "https://a.example,https://b.example"}
    settings = settings_from(["--config", str(config), "--keepalive", "4"], environ)
    assert settings.port == 9000  # the file
    assert settings.read_timeout == 40.0  # the environment over the file
    assert settings.keepalive == 4.0  # the flag over both
    assert settings.allow_origin == ("https://a.example", "https://b.example")
    assert settings.consent == "none" and settings.log_level == "INFO"  # the file; the default
    assert settings_from([], {"TOOLKEEPER_CONFIG": str(config)}).port == 9000


def test_secrets_come_from_files_and_never_show(tmp_path):
    (tmp_path / "token").write_text("s3cret-token\n")
    (tmp_path / "store-url").write_text("postgresql://tk:hunter2@db/tk\n")
    config = tmp_path / "toolkeeper.yaml"
    config.write_text(f"store_file: {tmp_path / 'store-url'}\n")
    settings = settings_from(["--config", str(config)], {"TOOLKEEPER_ADMIN_TOKEN_FILE": str(tmp_path / "token")})
    assert settings.admin_token == "s3cret-token" and settings.store == "postgresql://tk:hunter2@db/tk"
    assert "s3cret" not in repr(settings) and "hunter2" not in repr(settings)


@pytest.mark.parametrize(("text", "said"), [
    ("prot: 9000\n", "unknown option 'prot'"),
    ("port: nine\n", "port: 'nine' is not an integer"),
    ("consent: maybe\n", "consent: 'maybe' is not one of auto, terminal, approvals, none"),
    ("- port\n", "must be a mapping"),
    ("port: [\n", "not valid YAML"),
    ("admin_token_file: /nonexistent/token\n", "cannot read the secret file"),
])
def test_a_broken_config_file_stops_serve_saying_what_is_wrong(tmp_path, text, said):
    config = tmp_path / "toolkeeper.yaml"
    config.write_text(text)
    agent = tmp_path / "agent.yaml"
    agent.write_text("upstream: http://127.0.0.1:9/v1\ntools: []\n")
    done = subprocess.run([sys.executable, "-m", "toolkeeper", "serve", str(agent), "--config", str(config)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    if "is not" in said:  # a value of the wrong type: said with the file it is in
        assert f"{config}: {said}" in done.stderr


def test_a_config_file_may_group_settings_by_their_first_word(tmp_path):
    config = tmp_path / "toolkeeper.yaml"
    config.write_text("hooks:\n  undecided: ask\nport: 9000\n")
    assert (settings_from(["--config", str(config)], {}).hooks_undecided, settings_from([], {}).hooks_undecided) \
        == ("ask", "defer")
    assert settings_from(["--config", str(config), "--hooks-undecided", "allow"], {}).hooks_undecided == "allow"
    config.write_text("hooks:\n  undecide: ask\n")
    with pytest.raises(SettingsError, match="unknown option 'hooks_undecide'"):
        settings_from(["--config", str(config)], {})


def test_a_wrong_environment_value_is_refused_too():
    with pytest.raises(SettingsError, match="TOOLKEEPER_WORKERS: workers: 'two' is not an integer"):
        settings_from([], {"TOOLKEEPER_WORKERS": "two"})


def test_serving_beyond_loopback_with_no_agent_keys_is_warned_of(tmp_path, caplog):
    from toolkeeper.app import agent_keys
    from toolkeeper.settings import Settings
    from toolkeeper.tools import load_agent_file

    (tmp_path / "agent.yaml").write_text("upstream: http://127.0.0.1:9/v1\ntools: []\n")
    agent = load_agent_file(tmp_path / "agent.yaml")
    with caplog.at_level("WARNING", logger="toolkeeper"):
        agent_keys(agent, Settings(host="127.0.0.1"))
        assert not caplog.records
        agent_keys(agent, Settings(host="0.0.0.0"))
    assert "serving on 0.0.0.0 with no agent keys listed" in caplog.text
