"""``manage.py cache stats | list | show ID | purge``: inspect and purge the answer cache.

Every deletion goes through :mod:`cache_layer.services`, so the exact store (Redis or local
memory) and the in-process semantic indexes forget the deleted entries too. Nothing asks for
confirmation; ``purge`` prints what it deleted. A bad argument (unknown id or scope, a limit below
1, no purge target) raises :class:`CommandError` naming the value.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count, Max, Min, Q, QuerySet, Sum
from django.utils import timezone

from cache_layer import services
from cache_layer.config import cache_config
from cache_layer.exact_store import get_exact_store
from cache_layer.models import CachedAnswer


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


class Command(BaseCommand):
    help = "Inspect and purge the answer cache: stats, list, show ID, purge (--scope S | --expired | --id ID | --all)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="{stats,list,show,purge}")
        sub.add_parser("stats", help="entries per scope: live, expired, hits, oldest and newest")
        ls = sub.add_parser("list", help="the newest entries, one a line")
        ls.add_argument("--scope", help="only this scope (as printed by stats)")
        ls.add_argument("--search", help="only entries whose question or answer contains this text")
        ls.add_argument("--limit", type=int, default=20, help="at most this many lines (default 20)")
        show = sub.add_parser("show", help="one entry in full")
        show.add_argument("id", type=int)
        purge = sub.add_parser("purge", help="delete entries (no confirmation)")
        target = purge.add_mutually_exclusive_group(required=True)
        target.add_argument("--scope", help="every entry of this scope")
        target.add_argument("--expired", action="store_true", help="expired entries only")
        target.add_argument("--id", type=int, dest="entry_id", help="one entry")
        target.add_argument("--all", action="store_true", help="every entry of every scope")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        getattr(self, f"_{action}")(**options)

    # --- stats ---------------------------------------------------------------------------------------

    def _stats(self, **_: Any) -> None:
        now = timezone.now()
        rows = list(
            CachedAnswer.objects.values("scope")
            .annotate(
                n=Count("id"),
                live=Count("id", filter=Q(expires_at__gt=now)),
                hits=Sum("hits"),
                oldest=Min("created_at"),
                newest=Max("created_at"),
            )
            .order_by("scope")
        )
        self.stdout.write(
            f"exact store: {get_exact_store().name}; size bound {cache_config().max_entries:,} entries, "
            f"TTL {services.ttl_s()} s"
        )
        if not rows:
            self.stdout.write("no cached answers")
            return
        self.stdout.write(f"{'entries':>8} {'live':>8} {'expired':>8} {'hits':>8}  {'oldest':19}  {'newest':19}  scope")
        for r in rows:
            self.stdout.write(
                f"{r['n']:>8} {r['live']:>8} {r['n'] - r['live']:>8} {r['hits'] or 0:>8}  "
                f"{_when(r['oldest']):19}  {_when(r['newest']):19}  {r['scope']}"
            )
        total, live = sum(r["n"] for r in rows), sum(r["live"] for r in rows)
        hits = sum(r["hits"] or 0 for r in rows)
        self.stdout.write(f"{total:>8} {live:>8} {total - live:>8} {hits:>8}  total over {len(rows)} scope(s)")

    # --- list / show ---------------------------------------------------------------------------------

    def _list(self, *, scope: str | None, search: str | None, limit: int, **_: Any) -> None:
        if limit < 1:
            raise CommandError(f"--limit must be at least 1, got {limit}")
        qs: QuerySet[CachedAnswer] = CachedAnswer.objects.order_by("-created_at", "-id")
        if scope is not None:
            self._require_scope(scope)
            qs = qs.filter(scope=scope)
        if search:
            qs = qs.filter(Q(question__icontains=search) | Q(answer__icontains=search))
        now = timezone.now()
        rows = list(qs.values_list("id", "hits", "expires_at", "scope", "question")[:limit])
        if not rows:
            self.stdout.write("no matching cached answers")
            return
        self.stdout.write(f"{'id':>8} {'hits':>6}  {'state':7}  {'expires':19}  question  [scope]")
        for entry_id, hits, expires_at, entry_scope, question in rows:
            state = "live" if expires_at > now else "expired"
            self.stdout.write(
                f"{entry_id:>8} {hits:>6}  {state:7}  {_when(expires_at):19}  "
                f"{_one_line(question, 60)}  [{entry_scope}]"
            )

    def _show(self, *, id: int, **_: Any) -> None:
        entry = CachedAnswer.objects.filter(id=id).first()
        if entry is None:
            raise CommandError(f"no cached answer with id {id}")
        vec = entry.vector()
        in_store = get_exact_store().get(entry.scope, entry.key_hash) is not None
        fields = [
            ("id", entry.id),
            ("scope", entry.scope),
            ("question", entry.question),
            ("exact key", entry.key_text),
            ("route", entry.route),
            ("model", entry.model),
            ("locale", entry.locale or "-"),
            ("prompt version", entry.system_prompt_version or "-"),
            ("grounded on", ", ".join(str(g) for g in entry.grounded_on) or "-"),
            ("created", _when(entry.created_at)),
            ("expires", f"{_when(entry.expires_at)} ({'live' if entry.expires_at > timezone.now() else 'expired'})"),
            ("hits", entry.hits),
            ("last hit", _when(entry.last_hit_at)),
            ("embedding", f"{vec.shape[0]} dims" if vec is not None else "-"),
            ("in exact store", f"{'yes' if in_store else 'no'} ({get_exact_store().name})"),
        ]
        for name, value in fields:
            self.stdout.write(f"{name + ':':16}{value}")
        self.stdout.write("answer:")
        self.stdout.write(entry.answer)

    # --- purge ---------------------------------------------------------------------------------------

    def _purge(self, *, scope: str | None, expired: bool, entry_id: int | None, all: bool, **_: Any) -> None:
        if scope is not None:
            self._require_scope(scope)
            n = services.purge(scope=scope)
            self.stdout.write(f"deleted {n} cached answer(s) in scope {scope}")
        elif expired:
            n = services.purge_expired()
            self.stdout.write(f"deleted {n} expired cached answer(s)")
        elif entry_id is not None:
            question = CachedAnswer.objects.filter(id=entry_id).values_list("question", flat=True).first()
            if question is None or not services.evict_entry(entry_id):
                raise CommandError(f"no cached answer with id {entry_id}")
            self.stdout.write(f"deleted cached answer {entry_id}: {_one_line(question, 60)}")
        else:
            n = services.purge()
            self.stdout.write(f"deleted {n} cached answer(s) in all scopes")

    def _require_scope(self, scope: str) -> None:
        if not CachedAnswer.objects.filter(scope=scope).exists():
            raise CommandError(f"no cached answers in scope {scope!r} (`manage.py cache stats` lists the scopes)")
