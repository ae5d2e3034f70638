"""Ops: the read-only dashboard (/ops/), its JSON (/ops/api/summary), /metrics and /healthz.\n\nReads Chat, Router and Cache; writes nothing."""
