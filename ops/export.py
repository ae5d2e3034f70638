"""The cost ledger as CSV (``GET /ops/export/ledger.csv``, docs/ops.md): one line per
``routing.UpstreamCall`` created in ``[start, end)``, oldest first, read in chunks as it is sent
(a million rows never sit in memory).

Columns: :data:`COLUMNS`. ``created_at`` is ISO 8601 UTC; ``cost_usd`` the ledger's Decimal as
written (6 places); empty cells for NULLs. A text cell that a spreadsheet would take for a
formula (starting with ``=``, ``+``, ``-``, ``@``) gets a leading ``'``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import Q

from routing.models import UpstreamCall

COLUMNS = (
    "id",
    "created_at",
    "conversation_id",
    "message_id",
    "api_key_id",
    "purpose",
    "tier",
    "model",
    "attempt",
    "outcome",
    "error_code",
    "http_status",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "ttft_ms",
    "latency_ms",
    "estimated",
)
CHUNK_ROWS = 2000


def _chunk(start: datetime, end: datetime, after: tuple[datetime, int] | None) -> list[tuple[Any, ...]]:
    """The next :data:`CHUNK_ROWS` rows after ``after`` (``(created_at, id)`` of the last row
    sent; keyset paging on the indexed ``created_at``, so each chunk is one short query and no
    cursor stays open between them)."""
    rows = UpstreamCall.objects.filter(created_at__gte=start, created_at__lt=end)
    if after is not None:
        rows = rows.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1]))
    return list(rows.order_by("created_at", "id").values_list(*COLUMNS)[:CHUNK_ROWS])


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return value


def _csv(rows: list[tuple[Any, ...]], *, header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    if header:
        writer.writerow(COLUMNS)
    writer.writerows([_cell(v) for v in row] for row in rows)
    return buffer.getvalue()


def _after(rows: list[tuple[Any, ...]]) -> tuple[datetime, int]:
    return rows[-1][1], rows[-1][0]  # (created_at, id)


def ledger_lines(*, start: datetime, end: datetime) -> Iterator[str]:
    """The CSV for a synchronous server (WSGI, the test client), a chunk of lines at a time."""
    yield _csv([], header=True)
    after = None
    while rows := _chunk(start, end, after):
        yield _csv(rows)
        after = _after(rows)


async def ledger_lines_async(*, start: datetime, end: datetime) -> AsyncIterator[str]:
    """The CSV for an ASGI server: each chunk is read off the event loop (``sync_to_async``), so
    a large export neither blocks the loop nor is read whole first."""
    yield _csv([], header=True)
    after = None
    while rows := await sync_to_async(_chunk)(start, end, after):
        yield _csv(rows)
        after = _after(rows)
