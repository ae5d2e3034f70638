"""Ops: the dashboard (/ops/), its JSON (/ops/api/summary, /ops/api/series), the ledger's CSV
export, /metrics and /healthz.

Reads Chat, Router and Cache; writes only its own derived tables (``ops.models``: hourly rollups
and queue samples, ``ops.rollup``)."""
