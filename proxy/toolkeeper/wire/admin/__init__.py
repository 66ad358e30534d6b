"""Everything under /toolkeeper/: the admin API (api.py), who may reach it (guard.py), browser sessions
(sessions.py), the limits' counts (limits.py) and the console's pages (console/). Nothing here is ever forwarded
to a model server."""

from toolkeeper.wire.admin.api import admin_app, answer_approval, approvals_api, pins_api, tools_api
from toolkeeper.wire.admin.console import Console
from toolkeeper.wire.admin.guard import MASTER, PREFIX, AdminGuard, same_origin, served_over_https
from toolkeeper.wire.admin.limits import LimitsView, limits_api

__all__ = [
    "MASTER",
    "PREFIX",
    "AdminGuard",
    "Console",
    "LimitsView",
    "admin_app",
    "answer_approval",
    "approvals_api",
    "limits_api",
    "pins_api",
    "same_origin",
    "served_over_https",
    "tools_api",
]
