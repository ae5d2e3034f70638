"""Staff search (``GET /console/api/search?q=``, docs/search.md): conversations found by the
words of their messages in any language, the shopper's e-mail, an order number named in them, or
the store's customer id; open and closed alike. Erased conversations are gone with their messages
(chat.retention), so they are never found.

How a query runs:

- the message index: ``Message.search_terms`` holds each message's terms
  (lib.search_terms.index_terms, computed in Python when the text is written); PostgreSQL indexes
  them with a GIN index on ``string_to_array(search_terms, ' ')`` and answers ``@>`` (every query
  term present); SQLite (the embedded default) with an FTS5 table over the same column, kept by
  triggers. :func:`index_ensure` creates either, idempotently, after every ``migrate``.
- Chinese (and other scripts without spaces) is indexed as single characters and bigrams, so a
  one- or two-character word is one exact term; a longer word is its bigrams plus a check of the
  message's text for the word as written (on the few candidate rows only).
- the conversation's own fields: ``contact_email`` and ``customer_email`` (case-insensitive,
  indexed on ``lower()``), ``customer_id`` (exact, indexed).

One result per conversation, newest last message first, at most :data:`LIMIT`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from lib.search_terms import Query, index_terms, query_terms

from .errors import InvalidSearch
from .models import Conversation, Message, Role, SearchLog

__all__ = ["LIMIT", "MAX_QUERY_CHARS", "Hit", "index_drop", "index_ensure", "messages_index", "search"]

#: At most this many conversations per search (CONTRACT.md, "Staff search").
LIMIT = 50
#: A longer query is refused (400): no one types 200 characters into a search box, and the term
#: list of a query stays short.
MAX_QUERY_CHARS = 200
#: The snippet's length in characters around the first match.
SNIPPET_CHARS = 160
#: Roles whose messages are indexed: the bot's own notices ("no one is online...", an agent left)
#: are the same words in every conversation and would only bury real matches. Order notices are
#: written with their terms (chat.services.orders: they name the order number).
INDEXED_ROLES = (Role.SHOPPER, Role.BOT, Role.AGENT)

_FTS = "chat_message_fts"
_GIN = "chat_message_search_terms"
_TRIGGERS = ("chat_message_fts_ai", "chat_message_fts_ad", "chat_message_fts_au")


@dataclass(frozen=True)
class Hit:
    """One conversation found: its id, status, the time of its last message (aware) and a
    snippet of the message that matched (or the matched e-mail / customer id)."""

    conversation: uuid.UUID
    status: str
    last_message_at: datetime
    snippet: str

    def as_json(self) -> dict[str, str]:
        """The contract's result shape: ``{"conversation", "status", "last_message_at", "snippet"}``."""
        return {
            "conversation": str(self.conversation),
            "status": self.status,
            "last_message_at": self.last_message_at.isoformat(),
            "snippet": self.snippet,
        }


def index_ensure(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Create the message index if it is missing (idempotent; run after every ``migrate`` by
    ``chat.apps``): on PostgreSQL a GIN index, on SQLite an FTS5 table with its triggers. On
    SQLite, Django rebuilds a table to alter it, which drops its triggers: when any is missing
    they are made again and the FTS table rebuilt from ``chat_message``. Returns whether anything
    was created."""
    conn = conn or connection
    table = Message._meta.db_table
    with conn.cursor() as cursor:
        columns = {c.name for c in conn.introspection.get_table_description(cursor, table)}
        if "search_terms" not in columns:  # migrated back before chat.0020 (or not yet to it)
            return False
        if conn.vendor == "postgresql":
            cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s", [_GIN])
            if cursor.fetchone():
                return False
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {_GIN} ON {table} "
                "USING gin (string_to_array(search_terms, ' ')) WHERE search_terms <> ''"
            )
            return True
        if conn.vendor != "sqlite":
            return False
        cursor.execute("SELECT name FROM sqlite_master WHERE name IN (%s, %s, %s, %s)", [_FTS, *_TRIGGERS])
        if len(cursor.fetchall()) == 1 + len(_TRIGGERS):
            return False
        # The "ascii" tokenizer splits on ASCII punctuation and spaces only: every non-ASCII
        # character (Chinese, Thai with its marks...) stays in its term, and the e-mail's
        # characters are declared part of a term. The terms are already case-folded.
        cursor.execute(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {_FTS} USING fts5(search_terms, content='{table}', "
            "content_rowid='id', tokenize=\"ascii tokenchars '@.+-_'\")"
        )
        for name in _TRIGGERS:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
        cursor.execute(
            f"CREATE TRIGGER {_TRIGGERS[0]} AFTER INSERT ON {table} BEGIN "
            f"INSERT INTO {_FTS}(rowid, search_terms) VALUES (new.id, new.search_terms); END"
        )
        cursor.execute(
            f"CREATE TRIGGER {_TRIGGERS[1]} AFTER DELETE ON {table} BEGIN "
            f"INSERT INTO {_FTS}({_FTS}, rowid, search_terms) VALUES ('delete', old.id, old.search_terms); END"
        )
        cursor.execute(
            f"CREATE TRIGGER {_TRIGGERS[2]} AFTER UPDATE OF search_terms ON {table} BEGIN "
            f"INSERT INTO {_FTS}({_FTS}, rowid, search_terms) VALUES ('delete', old.id, old.search_terms); "
            f"INSERT INTO {_FTS}(rowid, search_terms) VALUES (new.id, new.search_terms); END"
        )
        cursor.execute(f"INSERT INTO {_FTS}({_FTS}) VALUES ('rebuild')")
    return True


def index_drop(conn: BaseDatabaseWrapper | None = None) -> None:
    """Drop the message index (chat.0020 migrated backwards): the GIN index, or the FTS5 table
    and its triggers, which would otherwise name a column that is gone."""
    conn = conn or connection
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute(f"DROP INDEX IF EXISTS {_GIN}")
        elif conn.vendor == "sqlite":
            for name in _TRIGGERS:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
            cursor.execute(f"DROP TABLE IF EXISTS {_FTS}")


def messages_index(*, batch: int = 2000) -> int:
    """Fill ``search_terms`` of the stored messages that have text but no terms (messages written
    before search existed); ``batch`` rows per statement. Returns how many rows were filled."""
    filled = 0
    last = 0
    while True:
        rows = list(
            Message.objects.filter(pk__gt=last, search_terms="", role__in=INDEXED_ROLES)
            .exclude(text="")
            .order_by("pk")
            .only("pk", "text")[:batch]
        )
        if not rows:
            return filled
        for row in rows:
            row.search_terms = index_terms(row.text)
        Message.objects.bulk_update(rows, ["search_terms"])
        filled += len(rows)
        last = rows[-1].pk


def _message_match(q: Query, vendor: str, *, sliced: bool) -> tuple[str, list[Any]]:
    """The SQL condition on message ``m`` for the query's terms and phrases, and its params.

    PostgreSQL, in a slice of the newest messages (``sliced``): the index is asked for one term
    (the longest) and the other terms are checked on the rows it gives. Asked for several terms,
    the planner estimates one row (its default selectivity for ``@>``), skips intersecting the
    index with the slice's id range, and fetches every match of the whole table (a common Chinese
    word, 3% of a million messages: 650 ms measured, against 30 ms for one term)."""
    params: list[Any]
    if vendor == "postgresql":
        if sliced and len(q.terms) > 1:
            key = max(q.terms, key=len)
            # "|| '{}'" keeps the full check off the index (not the indexed expression).
            sql = (
                "m.search_terms <> '' AND string_to_array(m.search_terms, ' ') @> %s::text[] "
                "AND (string_to_array(m.search_terms, ' ') || '{}'::text[]) @> %s::text[]"
            )
            params = [[key], list(q.terms)]
        else:
            sql = "m.search_terms <> '' AND string_to_array(m.search_terms, ' ') @> %s::text[]"
            params = [list(q.terms)]
    else:
        match = " ".join('"' + t.replace('"', '""') + '"' for t in q.terms)
        sql, params = f"m.id IN (SELECT rowid FROM {_FTS} WHERE {_FTS} MATCH %s)", [match]
    for phrase in q.phrases:  # runs of unspaced script only: no LIKE wildcards in them
        sql += " AND m.text LIKE %s"
        params.append(f"%{phrase}%")
    return sql, params


def find_sql(q: Query, *, newest: int | None = None) -> tuple[str, list[Any]]:
    """One statement of a search and its params (bench/search.py explains it): rows
    ``(conversation id, status, last message time, id of the newest matching message or None)``
    of the newest :data:`LIMIT` conversations found. ``newest``: only the newest ``newest``
    message ids are searched (a slice, see :func:`_find`); None: all of them."""
    c_table = connection.ops.quote_name(Conversation._meta.db_table)
    m_table = connection.ops.quote_name(Message._meta.db_table)
    parts: list[str] = []
    params: list[Any] = []
    if q.terms:
        cond, cond_params = _message_match(q, connection.vendor, sliced=newest is not None)
        params += cond_params
        if newest is not None:
            cond += f" AND m.id > (SELECT MAX(id) FROM {m_table}) - %s"
            params.append(newest)
        # The conversations of the newest matches only: the rest cannot be in the first LIMIT
        # (but see _find on a conversation whose match is old and whose last message is new).
        parts.append(
            f"SELECT * FROM (SELECT m.conversation_id AS cid, MAX(m.id) AS mid FROM {m_table} m WHERE {cond} "
            f"GROUP BY m.conversation_id ORDER BY MAX(m.id) DESC LIMIT {LIMIT}) newest_hits"
        )
    fields: list[str] = []
    if q.email:
        fields += ["LOWER(contact_email) = %s", "LOWER(customer_email) = %s"]
        params += [q.email, q.email]
    if q.raw:
        fields.append("(customer_id = %s AND customer_id <> '')")
        params.append(q.raw)
    parts.append(f"SELECT id AS cid, NULL AS mid FROM {c_table} WHERE {' OR '.join(fields)}")
    # The conversation's last message: the (conversation, seq) unique index, one probe per hit.
    sql = (
        f"SELECT c.id, c.status, COALESCE((SELECT lm.created_at FROM {m_table} lm "
        "WHERE lm.conversation_id = c.id ORDER BY lm.seq DESC LIMIT 1), c.created_at) AS last_at, hit.mid "
        f"FROM (SELECT cid, MAX(mid) AS mid FROM ({' UNION ALL '.join(parts)}) u GROUP BY cid) hit "
        f"JOIN {c_table} c ON c.id = hit.cid WHERE c.sandbox = %s ORDER BY last_at DESC, c.id DESC LIMIT {LIMIT}"
    )
    params.append(False)  # a bot test's conversation is never found (Conversation.sandbox)
    return sql, params


#: The slices of :func:`_find`: the newest 20,000 message ids, then 8 times as many, and so on,
#: and at last all of them. A word in 1% of messages has about 200 matches in the first slice,
#: enough for :data:`LIMIT` conversations, so a common word costs one statement over the newest
#: rows (measured: bench/search.py); a rare one a few cheap statements (its posting list is short).
SLICES = (20_000, 160_000, 1_280_000, None)


def _find(q: Query) -> list[tuple[Any, str, Any, int | None]]:
    """The newest :data:`LIMIT` conversations found. Without slices a common word fetches every
    match to keep 50 (a word in 3.4% of a million messages: 34,000 rows, 3 s measured in
    bench/search.py); the slices stop as soon as one holds :data:`LIMIT` conversations with a
    match. Statements: 1 for a common word, at most 4 for a rare one (3 slices and the newest id). Order: the conversations of the newest
    matches, by their last message; a conversation whose only match is older than every match of
    those (and which went on since) can be left out, as a search engine's "most recent" does."""
    rows: list[tuple[Any, str, Any, int | None]] = []
    top: int | None = None
    for newest in SLICES if q.terms else (None,):
        if newest is not None and top is not None and newest >= top:
            continue  # the slice is the whole table: the last, unbounded statement says it all
        sql, params = find_sql(q, newest=newest)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = [(r[0], r[1], r[2], r[3]) for r in cursor.fetchall()]
            if sum(1 for r in rows if r[3] is not None) >= LIMIT:
                break
            if newest is not None and top is None:
                cursor.execute(f"SELECT MAX(id) FROM {connection.ops.quote_name(Message._meta.db_table)}")
                top = cursor.fetchone()[0] or 0
        if newest is not None and newest >= (top or 0):
            break  # that slice already held every message
    return rows


def _aware(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite hands back text through a raw cursor
        value = parse_datetime(value)
    assert isinstance(value, datetime)
    return value if timezone.is_aware(value) else timezone.make_aware(value, UTC)


def _snippet(text: str, q: Query) -> str:
    """Up to :data:`SNIPPET_CHARS` characters of ``text`` around the first query word found in
    it (case-insensitively), with "…" where it was cut."""
    flat = " ".join(text.split())
    low = flat.casefold()
    at = -1
    for needle in (*q.phrases, *sorted(q.terms, key=len, reverse=True)):
        at = low.find(needle)
        if at >= 0:
            break
    if len(flat) <= SNIPPET_CHARS:
        return flat
    start = max(0, min(at - SNIPPET_CHARS // 3, len(flat) - SNIPPET_CHARS)) if at > 0 else 0
    out = flat[start : start + SNIPPET_CHARS]
    return ("…" if start else "") + out + ("…" if start + SNIPPET_CHARS < len(flat) else "")


def search(*, text: str, agent: Any) -> list[Hit]:
    """The conversations ``text`` finds for ``agent`` (a user the caller checked is an agent),
    newest last message first, at most :data:`LIMIT`; the search is logged (:class:`SearchLog`:
    the agent, the number of results, the time taken in ms, and the query unless it holds an
    e-mail). Three statements: the search, the snippets' messages, the log row.

    Raises :class:`~chat.errors.InvalidSearch` (code ``invalid`` or ``too_long``) for an empty
    query or one over :data:`MAX_QUERY_CHARS` characters."""
    raw = text.strip()
    if not raw:
        raise InvalidSearch("invalid", "q: give a word, an e-mail, an order number or a customer id")
    if len(raw) > MAX_QUERY_CHARS:
        raise InvalidSearch("too_long", f"q: at most {MAX_QUERY_CHARS} characters")
    started = time.perf_counter()
    q = query_terms(raw)
    rows = _find(q)
    texts = dict(Message.objects.filter(pk__in=[r[3] for r in rows if r[3] is not None]).values_list("pk", "text"))
    pk = Conversation._meta.pk
    assert pk is not None
    hits = [
        Hit(
            conversation=pk.to_python(cid),
            status=status,
            last_message_at=_aware(last_at),
            snippet=_snippet(texts[mid], q) if mid is not None else (q.email or q.raw),
        )
        for cid, status, last_at, mid in rows
    ]
    SearchLog.objects.create(
        agent=agent,
        query="" if "@" in raw else raw,
        results=len(hits),
        took_ms=(time.perf_counter() - started) * 1000,
    )
    return hits
