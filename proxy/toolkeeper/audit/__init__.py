"""The audit trail: one record per declared call, redacted, hash-chained, in SQLite or PostgreSQL.

It imports nothing of the other layers: the engine hands it an
`ExecutionRecord`, readers get `AuditEntry` objects back.
"""

from toolkeeper.audit.calls import principal_user
from toolkeeper.audit.databases import open_audit, without_password
from toolkeeper.audit.events import AuditError, DamagedTrail
from toolkeeper.audit.formats import FORMATS, opa_event, otlp_request
from toolkeeper.audit.record import SOURCES, STATUSES, AuditEntry, CallStatus, ExecutionRecord, Observer
from toolkeeper.audit.redaction import DEFAULT_PATTERNS, REDACTED, Redactor
from toolkeeper.audit.trail import SQLAudit

__all__ = [
    "DEFAULT_PATTERNS",
    "FORMATS",
    "REDACTED",
    "SOURCES",
    "STATUSES",
    "AuditEntry",
    "AuditError",
    "CallStatus",
    "DamagedTrail",
    "ExecutionRecord",
    "Observer",
    "Redactor",
    "SQLAudit",
    "opa_event",
    "open_audit",
    "otlp_request",
    "principal_user",
    "without_password",
]
