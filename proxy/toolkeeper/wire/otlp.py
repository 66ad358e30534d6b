"""`--otlp-endpoint`: one OpenTelemetry span per call, sent to a collector over OTLP/HTTP (JSON).

Records are turned into spans as they complete (an observer, never in the way of a call) and sent in batches
every second to `{endpoint}/v1/traces`. A collector that is down loses spans, not calls: the failure is
logged once until one batch gets through again; the audit trail stays the record of truth.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from toolkeeper.audit import AuditEntry, ExecutionRecord, otlp_request

log = logging.getLogger("toolkeeper")

EVERY = 1.0  # seconds between batches
MOST = 2000  # spans held while the collector is away; older ones are dropped


class OtlpExporter:
    def __init__(self, endpoint: str):
        self.url = endpoint.rstrip("/") + "/v1/traces"
        self.pending: list[AuditEntry] = []
        self.failing = False

    def __call__(self, record: ExecutionRecord) -> None:
        """An observer of completed records."""
        self.pending.append(AuditEntry.model_validate(record.model_dump()))
        del self.pending[:-MOST]

    async def run(self, app: web.Application) -> Any:
        """A cleanup context: sends while the app runs, and what is left at the end."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            task = asyncio.get_running_loop().create_task(self._send_forever(session))
            yield
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self.send(session)

    async def _send_forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(EVERY)
            await self.send(session)

    async def send(self, session: aiohttp.ClientSession) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        sent = False
        try:
            async with session.post(self.url, data=orjson.dumps(otlp_request(batch)),
                                    headers={"Content-Type": "application/json"}) as answer:
                if answer.status >= 300:
                    raise aiohttp.ClientError(f"the collector answered {answer.status}")
            sent = True
            if self.failing:
                log.info("the OTLP collector at %s takes spans again", self.url)
            self.failing = False
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not self.failing:
                log.warning("the OTLP collector at %s did not take %d spans (kept for the next try): %s", self.url,
                            len(batch), exc)
            self.failing = True
        finally:
            if not sent:  # failed or cancelled: tried again with the next batch, the oldest dropped past MOST
                self.pending = [*batch, *self.pending][-MOST:]
