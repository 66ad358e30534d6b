"""Where asks reach people: the channels a policy file declares, and which an ask goes to.

    channels:
      security-oncall: {type: slack, url_env: SLACK_ONCALL_WEBHOOK}
      pager: {type: webhook, url: "https://hooks.example.com/toolkeeper", secret_env: TOOLKEEPER_WEBHOOK_SECRET}
    notify: [pager]              # the channels of an ask no rule or limit names its own for
    rules:
      - id: prod-deploys-ask
        effect: ask
        notify: [security-oncall]
        when: {tool: deploy, arguments: {env: {equals: prod}}}

A webhook's body is JSON, signed as the Standard Webhooks specification says
(`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256>`)
with the secret in `secret_env`; a Slack channel posts Block Kit to an incoming
webhook, whose URL is itself the secret (`url_env`). Delivery is wire/notify.py's.
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from toolkeeper.common import Strict


def is_http_url(url: str) -> bool:
    """An http(s) URL with a host, that parses (`http://[::1/x` does not, nor a port that is no number)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - read for its ValueError
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


class Channel(Strict):
    type: Literal["webhook", "slack"]
    url: str | None = None  # the URL, written here (a webhook's: signed, so it may be known) ...
    url_env: str | None = None  # ... or the variable that holds it (a Slack incoming webhook's URL is its secret)
    secret_env: str | None = None  # a webhook's signing secret: the variable that holds it (whsec_... or raw)
    timeout: float = Field(default=5.0, gt=0, le=60)  # seconds for one attempt

    @model_validator(mode="after")
    def _complete(self) -> Channel:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("a channel has url: or url_env:, one of the two")
        if self.url is not None and not is_http_url(self.url):
            raise ValueError(f"url: {self.url!r} is not an http(s) URL")
        if self.type == "webhook" and not self.secret_env:
            raise ValueError("a webhook channel signs what it sends: name the variable holding the secret "
                             "(secret_env:)")
        if self.type == "slack" and self.secret_env:
            raise ValueError("a Slack incoming webhook is not signed: its URL is the secret (url_env:)")
        return self

    def target(self) -> str | None:
        """The URL to post to: written here, or read from its variable (None when the variable is unset, or holds
        no http(s) URL: its value is the secret, and is never said)."""
        url = self.url if self.url is not None else os.environ.get(self.url_env or "") or None
        return url if url is not None and is_http_url(url) else None

    def secret(self) -> str | None:
        return os.environ.get(self.secret_env or "") or None
