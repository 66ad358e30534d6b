"""Who a call is for and when it is made: the tests of a rule's `agent:`, `principal:` and `time:`."""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from toolkeeper.common import Strict
from toolkeeper.policy.conditions import ValueTest


class AgentTest(Strict):
    ids: tuple[str, ...] | None = None  # the short hashes of agents' credentials
    header: ValueTest | None = None  # the identity header the deployment sets

    def holds(self, agent: dict[str, Any]) -> bool:
        if self.ids is not None and agent.get("id") not in self.ids:
            return False
        return self.header is None or self.header.holds(agent.get("header"), agent.get("header") is not None)


class MembersTest(Strict):
    """Tests on a set of names: `any` of these, `all` of these, `none` of these (globs); a list is `any`. The
    principal's groups and the call's labels are tested so."""

    any: tuple[str, ...] | None = None
    all: tuple[str, ...] | None = None
    none: tuple[str, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return {"any": [value] if isinstance(value, str) else value} if isinstance(value, (str, list, tuple)) \
            else value

    def holds(self, members: Any) -> bool:
        given = [str(member) for member in members] if isinstance(members, (list, tuple, set, frozenset)) else []

        def held(glob: str) -> bool:
            return any(fnmatch.fnmatchcase(member, glob) for member in given)

        return ((self.any is None or any(held(glob) for glob in self.any))
                and (self.all is None or all(held(glob) for glob in self.all))
                and (self.none is None or not any(held(glob) for glob in self.none)))


class GroupsTest(MembersTest):
    """The principal's groups."""


class PrincipalTest(Strict):
    """Who the call is for (the policy input's `principal`): its user, groups, issuer, agent and chosen claims."""

    user: ValueTest | None = None
    agent: ValueTest | None = None
    issuer: ValueTest | None = None
    groups: GroupsTest | None = None
    claims: dict[str, ValueTest] = Field(default_factory=dict)

    def holds(self, principal: dict[str, Any]) -> bool:
        for name in ("user", "agent", "issuer"):
            test = getattr(self, name)
            if test is not None and not _held(test, principal.get(name), principal.get(name) is not None):
                return False
        groups = principal.get("groups")
        if self.groups is not None and not self.groups.holds(groups if isinstance(groups, list) else []):
            return False
        claims = principal.get("claims") or {}
        return all(_held(test, claims.get(name), name in claims) for name, test in self.claims.items())


def _held(test: ValueTest, value: Any, present: bool) -> bool:
    """A principal's field no token or header gave is read as null, not skipped: `user: {not_equals: ada}` holds for
    a call that names no user (a rule meant to stop everyone but Ada must stop the anonymous too); only `present:`
    asks whether it was given."""
    return test.holds(value, present if test.present is not None else True)


class TimeTest(Strict):
    weekdays: tuple[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"], ...] | None = None
    hours: str | None = None  # "09-17": from 09:00 to 17:59, in the time zone of the request time

    @field_validator("hours")
    @classmethod
    def _hours(cls, value: str | None) -> str | None:
        if value is not None:
            match = re.fullmatch(r"(\d{1,2})-(\d{1,2})", value)
            if not match or int(match.group(1)) > 23 or int(match.group(2)) > 23:
                raise ValueError('hours are a range like "09-17" (from 09:00 to 17:59)')
        return value

    def holds(self, request: dict[str, Any]) -> bool:
        if self.weekdays is not None and request.get("weekday") not in self.weekdays:
            return False
        if self.hours is not None:
            start, end = (int(part) for part in self.hours.split("-"))
            hour = request.get("hour", -1)
            inside = start <= hour <= end if start <= end else (hour >= start or hour <= end)
            if not inside:
                return False
        return True
