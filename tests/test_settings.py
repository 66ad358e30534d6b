"""Each setting is declared once: the flags come from `Settings`, and the reference lists every one."""

from __future__ import annotations

import argparse
from dataclasses import fields

from conftest import ROOT

from toolkeeper.settings import Settings


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
