"""What one answer at a time per conversation (issue 29) costs a claim: the in-flight test
(no claim holds, no answer row streaming) is two more conditions of the claim's own statements
(``chat.services.messages``). Measured against a baseline of the same statements without them
(the code before the change, copied here), interleaved, in one process.

Per variant, ``--rounds`` (2,000) claims of each kind, on a database holding ``--conversations``
(2,000) conversations of 20 finished messages each, 2% of them with an answer streaming (rows
the partial index ``message_streaming_conversation`` holds):

* ``message_receive(claim=True)``: a shopper message stored and claimed in one transaction (the
  path of nearly every message);
* ``answer_claim``: the answering loop's claim of the next message (after an answer, or a message
  stored while the loop ran).

Wall time per call, ms: mean, p50, p99 (numpy's percentiles, linear interpolation), and the
differences of the mean and of the p50 against the baseline (the cost per claim; on a busy
machine the p50's is the steadier).

    .venv/bin/python bench/answer_in_flight.py                 # SQLite, a temporary file
    .venv/bin/python bench/answer_in_flight.py --db postgres   # a fresh database on TEST_DATABASE_URL's server
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["KEFU_NO_WARMUP"] = "1"
    os.environ.pop("REDIS_URL", None)
    if args.db == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/bench.sqlite3"
            return run(args)
    import psycopg

    admin = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = f"kefu_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = urlsplit(admin)._replace(path="/" + name).geturl()
    try:
        return run(args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def baseline_claim_if_none_older(conversation_id: uuid.UUID, *, answered_seq: int, seq: int) -> bool:
    """``_claim_if_none_older`` before issue 29 (no in-flight test)."""
    from django.db import connection

    from chat.models import Conversation, Message, Role
    from chat.services.messages import _claim_deadline_db

    conv = connection.ops.quote_name(Conversation._meta.db_table)
    msg = connection.ops.quote_name(Message._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {conv} SET answered_seq = %s, claim_until = %s WHERE id = %s AND NOT EXISTS ("
            f"SELECT 1 FROM {msg} WHERE conversation_id = %s AND role = %s AND seq > %s AND seq < %s)",
            [seq, _claim_deadline_db(), pk, pk, Role.SHOPPER.value, answered_seq, seq],
        )
        return cursor.rowcount == 1


def baseline_answer_claim(*, conversation_id: uuid.UUID) -> Any:
    """``answer_claim`` before issue 29 (no in-flight test, no ``last_seq`` compare)."""
    from django.db import connection

    from chat.models import Conversation, Message, Role
    from chat.services.messages import _claim_deadline_db

    conv_table = connection.ops.quote_name(Conversation._meta.db_table)
    msg_table = connection.ops.quote_name(Message._meta.db_table)
    columns = ", ".join(f"m.{connection.ops.quote_name(str(f.column))}" for f in Message._meta.concrete_fields)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    while True:
        rows = list(
            Message.objects.raw(
                f"SELECT {columns}, c.answered_seq AS claimed_after FROM {conv_table} c "
                f"JOIN {msg_table} m ON m.conversation_id = c.id "
                "WHERE c.id = %s AND m.role = %s AND m.seq > c.answered_seq ORDER BY m.seq LIMIT 1",
                [pk, Role.SHOPPER.value],
            )
        )
        if not rows:
            return None
        msg = rows[0]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {conv_table} SET answered_seq = %s, claim_until = %s WHERE id = %s AND answered_seq = %s "
                "RETURNING status, locale, last_seq, customer_id, address_key",
                [msg.seq, _claim_deadline_db(), pk, msg.claimed_after],
            )
            if cursor.fetchone() is not None:
                return msg


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from chat.models import Conversation, Message, MessageState, Role
    from chat.services import messages as svc

    call_command("migrate", verbosity=0)
    rng = random.Random(args.seed)
    now = timezone.now()
    convs = [Conversation(token_hash="0" * 64, last_seq=20, answered_seq=19) for _ in range(args.conversations)]
    Conversation.objects.bulk_create(convs, batch_size=1000)
    rows = []
    streaming = set(rng.sample(range(len(convs)), max(1, len(convs) // 50)))
    for i, conv in enumerate(convs):
        for seq in range(1, 21):
            role = Role.SHOPPER if seq % 2 else Role.BOT
            state = MessageState.STREAMING if i in streaming and seq == 20 else MessageState.DONE
            rows.append(
                Message(
                    conversation=conv,
                    seq=seq,
                    role=role,
                    text=f"message {seq}",
                    state=state,
                    reply_to_seq=seq - 1 if role == Role.BOT else None,
                    created_at=now,
                )
            )
    Message.objects.bulk_create(rows, batch_size=2000)
    idle = [c.pk for i, c in enumerate(convs) if i not in streaming]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")

    current_receive, current_claim = svc._claim_if_none_older, svc.answer_claim

    def receive(variant: str, cid: uuid.UUID, n: int) -> float:
        svc._claim_if_none_older = current_receive if variant == "current" else baseline_claim_if_none_older
        t = time.perf_counter()
        got = svc.message_receive(conversation_id=cid, client_id=f"r{n}", text="Do you ship to Canada?", claim=True)
        took = time.perf_counter() - t
        assert got.claimed is not None
        return took

    def claim(variant: str, cid: uuid.UUID, n: int) -> float:
        svc.message_receive(conversation_id=cid, client_id=f"a{n}", text="And to Mexico?", claim=False)
        fn: Callable[..., Any] = current_claim if variant == "current" else baseline_answer_claim
        t = time.perf_counter()
        got = fn(conversation_id=cid)
        took = time.perf_counter() - t
        assert got is not None
        return took

    results: dict[tuple[str, str], list[float]] = {}
    for kind, step in (("message_receive(claim=True)", receive), ("answer_claim", claim)):
        for n in range(args.rounds):
            order = ["current", "baseline"] if n % 2 else ["baseline", "current"]
            for variant in order:
                cid = rng.choice(idle)
                took = step(variant, cid, n * 2 + (variant == "current"))
                # The answer's row ends the claim (untimed), so the conversation is idle again.
                Conversation.objects.filter(pk=cid).update(claim_until=None)
                results.setdefault((kind, variant), []).append(took * 1000)
    svc._claim_if_none_older = current_receive

    print(
        f"database: {connection.vendor}; {args.conversations} conversations, {len(streaming)} with an answer streaming"
    )
    print(
        f"{'claim':<30} {'variant':<9} {'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8} {'mean vs baseline':>17} {'p50 vs baseline':>16}"
    )
    for kind in ("message_receive(claim=True)", "answer_claim"):
        base = float(np.mean(results[(kind, "baseline")]))
        base50 = float(np.percentile(results[(kind, "baseline")], 50))
        for variant in ("baseline", "current"):
            v = np.asarray(results[(kind, variant)])
            diff = "" if variant == "baseline" else f"{float(v.mean()) - base:+.3f} ms"
            diff50 = "" if variant == "baseline" else f"{float(np.percentile(v, 50)) - base50:+.3f} ms"
            print(
                f"{kind:<30} {variant:<9} {v.mean():8.3f} {np.percentile(v, 50):8.3f} "
                f"{np.percentile(v, 99):8.3f} {diff:>17} {diff50:>16}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
