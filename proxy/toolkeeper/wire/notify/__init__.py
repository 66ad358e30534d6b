"""Asks that reach people where they are: the `notify:` channels of the policy file.

    messages.py   what a channel is sent: a signed Standard Webhooks message, or a Slack Block Kit message
    sender.py     the notifier: each new ask to its channels, in the background, tried again with backoff

The approvals channel (policy/approvals.py) announces each new waiting call;
the composition root hands it `Notifier.announce`. The link each message
carries opens the call in the console (`/toolkeeper/queue/{id}`), which
never approves by being opened.
"""

from toolkeeper.wire.notify.messages import signature, signing_key, slack_message, webhook_body
from toolkeeper.wire.notify.sender import OUTCOMES, Notifier

__all__ = ["OUTCOMES", "Notifier", "signature", "signing_key", "slack_message", "webhook_body"]
