"""``manage.py cache``: stats, list, show, purge, their errors, and the admin's purge action."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import numpy as np
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from cache_layer import services, vector_index
from cache_layer.exact_store import LocalExactStore, set_exact_store
from cache_layer.models import CachedAnswer

pytestmark = pytest.mark.django_db

SCOPE = services.scope_key(store="lantern", locale="en", tier="simple", faq_version="1", prompt_version="v1")
ZH_SCOPE = services.scope_key(store="lantern", locale="zh", tier="simple", faq_version="1", prompt_version="v1")


def cached(question: str, answer: str, *, scope: str = SCOPE, expired: bool = False, hits: int = 0) -> CachedAnswer:
    """A row as services.store writes it (a fixed unit vector stands in for the embedding)."""
    key = services.exact_key_text(question)
    vec = np.zeros(384, dtype=np.float32)
    vec[len(question) % 384] = 1.0
    delta = timedelta(hours=-1) if expired else timedelta(days=7)
    return CachedAnswer.objects.create(
        scope=scope,
        key_hash=services._key_hash(key),
        key_text=key,
        question=question,
        answer=answer,
        embedding=vec.tobytes(),
        route="llm.simple",
        model="gpt-test",
        locale="en",
        grounded_on=[4],
        system_prompt_version="v1",
        expires_at=timezone.now() + delta,
        hits=hits,
    )


def run(*args: str) -> str:
    out = StringIO()
    call_command("cache", *args, stdout=out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def store() -> Iterator[LocalExactStore]:
    """A fresh local exact store for each test."""
    s = LocalExactStore()
    set_exact_store(s)
    vector_index.forget()
    yield s
    set_exact_store(None)


@pytest.fixture
def entries() -> dict[str, CachedAnswer]:
    return {
        "canada": cached("Do you ship to Canada?", "Yes, in 5-7 days.", hits=3),
        "returns": cached("What is your return policy?", "30 days.", hits=1),
        "old": cached("Do you sell gift cards?", "Not yet.", expired=True),
        "zh": cached("可以退货吗？", "可以，30天内。", scope=ZH_SCOPE, hits=2),
    }


def test_stats_counts_per_scope(entries: dict[str, CachedAnswer]) -> None:
    out = run("stats")
    assert "exact store: local" in out
    en_line = next(line for line in out.splitlines() if line.endswith(SCOPE))
    zh_line = next(line for line in out.splitlines() if line.endswith(ZH_SCOPE))
    assert en_line.split()[:4] == ["3", "2", "1", "4"]  # entries, live, expired, hits
    assert zh_line.split()[:4] == ["1", "1", "0", "2"]
    assert "4        3        1        6  total over 2 scope(s)" in out


def test_stats_on_an_empty_cache() -> None:
    assert "no cached answers" in run("stats")


def test_list_filters_by_scope_and_search_and_limits(entries: dict[str, CachedAnswer]) -> None:
    out = run("list")
    assert all(e.question in out for e in entries.values())
    assert "expired" in next(line for line in out.splitlines() if "gift cards" in line)
    out = run("list", "--scope", ZH_SCOPE)
    assert "可以退货吗" in out and "Canada" not in out
    out = run("list", "--search", "5-7 DAYS")  # answers are searched too, case-insensitively
    assert "Canada" in out and "return policy" not in out
    out = run("list", "--limit", "1")
    assert len([line for line in out.splitlines()[1:] if line.strip()]) == 1
    assert "no matching cached answers" in run("list", "--search", "teleport")


def test_show_prints_the_whole_entry(entries: dict[str, CachedAnswer]) -> None:
    canada = entries["canada"]
    out = run("show", str(canada.id))
    assert f"id:             {canada.id}" in out
    assert "Yes, in 5-7 days." in out and "grounded on:    4" in out and "embedding:      384 dims" in out
    assert "in exact store: no (local)" in out
    assert services.lookup(question="do you ship to canada", scope=SCOPE, embedding=None) is not None
    assert "in exact store: yes (local)" in run("show", str(canada.id))


@pytest.mark.parametrize(
    "args, message",
    [
        (("show", "424242"), "no cached answer with id 424242"),
        (("list", "--limit", "0"), "--limit must be at least 1, got 0"),
        (("list", "--scope", "store=nowhere"), "no cached answers in scope 'store=nowhere'"),
        (("purge", "--scope", "store=nowhere"), "no cached answers in scope 'store=nowhere'"),
        (("purge", "--id", "424242"), "no cached answer with id 424242"),
        (("show", "abc"), "invalid int value: 'abc'"),
        (("purge",), "one of the arguments --scope --expired --id --all is required"),
        (("purge", "--all", "--expired"), "not allowed with argument"),
        (("vacuum",), "invalid choice: 'vacuum'"),
    ],
)
def test_bad_arguments_name_the_bad_value(
    entries: dict[str, CachedAnswer], args: tuple[str, ...], message: str
) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(*args)
    assert CachedAnswer.objects.count() == 4  # nothing deleted by a bad command


def warm(store: LocalExactStore) -> None:
    """Exact hits on every live entry, so that each is in the exact store."""
    for q, scope in (
        ("Do you ship to Canada?", SCOPE),
        ("What is your return policy?", SCOPE),
        ("可以退货吗？", ZH_SCOPE),
    ):
        assert services.lookup(question=q, scope=scope, embedding=None) is not None
    assert len(store) == 3


def test_purge_id(entries: dict[str, CachedAnswer], store: LocalExactStore) -> None:
    warm(store)
    out = run("purge", "--id", str(entries["canada"].id))
    assert out.strip() == f"deleted cached answer {entries['canada'].id}: Do you ship to Canada?"
    assert not CachedAnswer.objects.filter(id=entries["canada"].id).exists()
    assert len(store) == 2
    assert services.lookup(question="Do you ship to Canada?", scope=SCOPE, embedding=None) is None


def test_purge_expired(entries: dict[str, CachedAnswer], store: LocalExactStore) -> None:
    warm(store)
    assert run("purge", "--expired").strip() == "deleted 1 expired cached answer(s)"
    assert set(CachedAnswer.objects.values_list("question", flat=True)) == {
        "Do you ship to Canada?",
        "What is your return policy?",
        "可以退货吗？",
    }
    assert len(store) == 3


def test_purge_scope_then_all(entries: dict[str, CachedAnswer], store: LocalExactStore) -> None:
    warm(store)
    assert run("purge", "--scope", SCOPE).strip() == f"deleted 3 cached answer(s) in scope {SCOPE}"
    assert list(CachedAnswer.objects.values_list("scope", flat=True)) == [ZH_SCOPE]
    assert len(store) == 1
    assert run("purge", "--all").strip() == "deleted 1 cached answer(s) in all scopes"
    assert CachedAnswer.objects.count() == 0 and len(store) == 0


def test_admin_lists_and_purges_selected_entries(
    entries: dict[str, CachedAnswer], store: LocalExactStore, admin_client: Any
) -> None:
    warm(store)
    page = admin_client.get("/admin/cache_layer/cachedanswer/", {"q": "Canada"})
    assert page.status_code == 200 and b"Do you ship to Canada?" in page.content
    assert b"return policy" not in page.content
    page = admin_client.get("/admin/cache_layer/cachedanswer/", {"state": "expired"})
    assert b"gift cards" in page.content and b"Canada" not in page.content
    selected = [entries["canada"].id, entries["zh"].id]
    response = admin_client.post(
        "/admin/cache_layer/cachedanswer/", {"action": "purge_selected", "_selected_action": [str(i) for i in selected]}
    )
    assert response.status_code == 302
    assert not CachedAnswer.objects.filter(id__in=selected).exists()
    assert CachedAnswer.objects.count() == 2
    assert len(store) == 1  # only the return-policy key is left
    assert services.lookup(question="可以退货吗？", scope=ZH_SCOPE, embedding=None) is None
