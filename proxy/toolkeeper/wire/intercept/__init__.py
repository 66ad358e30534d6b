"""`toolkeeper intercept`'s side in toolkeeper: the signed upstream of a re-routed request (header.py), what
both sides agree on (routing.py), and the mitmproxy addon itself (addon.py, run by mitmdump, never imported)."""

from pathlib import Path

from toolkeeper.wire.intercept.header import MAX_AGE, InterceptedUpstream
from toolkeeper.wire.intercept.routing import ENDPOINTS, HEADER, HOST_NAME, sign

ADDON = Path(__file__).resolve().parent / "addon.py"

__all__ = ["ADDON", "ENDPOINTS", "HEADER", "HOST_NAME", "MAX_AGE", "InterceptedUpstream", "sign"]
