"""argv templates: one value, one entry; arrays expand; dashes refused; absent optionals dropped."""

from __future__ import annotations

import pytest

from toolkeeper.tools import CommandTemplate, Parameter, RenderError, TemplateError

PARAMS = {
    "version": Parameter(type="string"),
    "notes": Parameter(type="string", required=False),
    "files": Parameter(type="array", items="string", required=False),
    "count": Parameter(type="integer"),
    "ratio": Parameter(type="number", required=False),
    "dry": Parameter(type="boolean", required=False),
    "delta": Parameter(type="string", required=False, allow_dash=True),
}


def template(*entries: str) -> CommandTemplate:
    return CommandTemplate.parse(entries, PARAMS)


def test_a_value_never_splits_or_becomes_shell():
    argv = template("./release.sh", "{{version}}").render({"version": "1.4.2; rm -rf ~ && $(id) `id` | x > y"})
    assert argv == ["./release.sh", "1.4.2; rm -rf ~ && $(id) `id` | x > y"]


def test_scalars_render_as_json_writes_them():
    argv = template("prog", "{{count}}", "--ratio={{ratio}}", "--dry={{dry}}").render(
        {"count": 3, "ratio": 2.5, "dry": False})
    assert argv == ["prog", "3", "--ratio=2.5", "--dry=false"]


def test_an_absent_optional_drops_its_entry():
    argv = template("prog", "{{version}}", "--notes={{notes}}", "--dry={{dry}}").render({"version": "1"})
    assert argv == ["prog", "1"]


def test_a_whole_entry_array_becomes_one_entry_per_element():
    argv = template("prog", "--", "{{files}}", "end").render({"files": ["a b", "c;d", ""]})
    assert argv == ["prog", "--", "a b", "c;d", "", "end"]
    assert template("prog", "{{files}}").render({"files": []}) == ["prog"]


def test_a_whole_entry_starting_with_a_dash_is_refused():
    with pytest.raises(RenderError, match="starts with '-'"):
        template("prog", "{{version}}").render({"version": "--force"})
    with pytest.raises(RenderError, match="starts with '-'"):
        template("prog", "{{files}}").render({"files": ["ok", "-rf"]})
    # inside an entry it cannot pose as an option; and allow_dash lets it through
    assert template("prog", "--version={{version}}").render({"version": "-1"}) == ["prog", "--version=-1"]
    assert template("prog", "{{delta}}").render({"delta": "-5"}) == ["prog", "-5"]


def test_negative_numbers_are_values_that_look_like_options():
    with pytest.raises(RenderError):
        template("prog", "{{count}}").render({"count": -5})


def test_nul_is_refused():
    with pytest.raises(RenderError, match="NUL"):
        template("prog", "{{version}}").render({"version": "a\x00b"})


@pytest.mark.parametrize(("entries", "message"), [
    (("{{version}}",), "program"),
    (("prog{{version}}",), "program"),
    (("prog", "{{nope}}"), "names no declared parameter"),
    (("prog", "--files={{files}}"), "must be a whole entry"),
    (("prog", "{{version"), "malformed"),
    (("",), "name the program"),
])
def test_bad_templates(entries, message):
    with pytest.raises(TemplateError, match=message):
        template(*entries)
