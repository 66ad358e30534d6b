"""Coercion: lenient only where no guess is needed; everything else answered with the reason."""

from __future__ import annotations

import pytest

from toolkeeper.tools import Parameter, ToolSpec, check_arguments, invalid_call_answer, parse_arguments

TOOL = ToolSpec(name="t", description="A tool.", command=("prog",), parameters={
    "n": Parameter(type="integer", minimum=1, maximum=10, description="How many."),
    "x": Parameter(type="number", required=False),
    "b": Parameter(type="boolean", required=False),
    "s": Parameter(type="string", required=False, pattern=r"^[a-z]+$"),
    "e": Parameter(type="string", required=False, enum=("red", "green")),
    "a": Parameter(type="array", items="integer", required=False),
    "d": Parameter(type="string", default="dflt"),
})


@pytest.mark.parametrize(("given", "expected"), [
    ({"n": "3"}, 3), ({"n": 3.0}, 3), ({"n": " 7 "}, 7),
])
def test_integers(given, expected):
    checked = check_arguments(TOOL, given)
    assert checked.ok and checked.values["n"] == expected


@pytest.mark.parametrize(("given", "value"), [
    ({"x": "2.5"}, 2.5), ({"x": "3"}, 3), ({"x": 1e3}, 1000.0), ({"b": "true"}, True), ({"b": "False"}, False),
    ({"a": ["1", 2]}, [1, 2]),
])
def test_lenient_coercions(given, value):
    checked = check_arguments(TOOL, {"n": 1, **given})
    assert checked.ok, checked.problems
    assert checked.values[next(iter(given))] == value


@pytest.mark.parametrize(("given", "problem"), [
    ({"n": "three"}, 'n must be a whole number like 3, got "three"'),
    ({"n": "2.5"}, "n must be a whole number"),
    ({"n": True}, "n must be a number, got true"),
    ({"n": 0}, "n must be at least 1"),
    ({"n": 11}, "n must be at most 10"),
    ({"n": 1, "b": "yes"}, 'b must be true or false, got "yes"'),
    ({"n": 1, "b": 1}, "b must be true or false, got 1"),
    ({"n": 1, "s": "ABC"}, "s must match the regular expression"),
    ({"n": 1, "s": 5}, "s must be a string, got 5; write it in quotes"),
    ({"n": 1, "e": "blue"}, 'e must be one of: red, green; got "blue"'),
    ({"n": 1, "a": "1,2"}, "a must be an array of integer values"),
    ({"n": 1, "a": [1, "two"]}, "a[1] must be a whole number"),
    ({"n": 1, "x": "NaN"}, "x must be a number"),
    ({"n": 1, "zzz": 1}, "zzz is not a parameter of t"),
    ({}, "n is missing; it is required"),
])
def test_refusals_say_why(given, problem):
    checked = check_arguments(TOOL, given)
    assert not checked.ok
    assert any(problem in p for p in checked.problems), checked.problems


def test_defaults_and_nulls():
    checked = check_arguments(TOOL, {"n": 1, "x": None})
    assert checked.values == {"n": 1, "d": "dflt"}


@pytest.mark.parametrize(("raw", "ok"), [
    ('{"n": 1}', True), ({"n": 1}, True), ("", True), ("[1]", False), ('{"n": ', False), (3, False),
])
def test_parse_arguments(raw, ok):
    _, problem = parse_arguments(raw)
    assert (problem is None) == ok


def test_the_answer_lists_every_parameter():
    answer = invalid_call_answer(TOOL, {"n": "x"}, ["n must be a whole number"])
    assert answer.splitlines()[:3] == ["Error: the call to t was not run:", "- n must be a whole number",
                                       'You sent: t({"n":"x"})']
    assert "- n (integer): Required. At least 1. At most 10. How many." in answer
    assert "- e (string): Optional. One of: red, green." in answer
    assert "- a (array of integer): Optional." in answer
    assert "- d (string): Optional. Default: dflt." in answer
