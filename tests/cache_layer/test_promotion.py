"""Verified promotion, the cache's half (cache_layer.promotion): near misses found, judged pairs
recorded once, a "same" verdict promotes (an alias, and the entry's verified cosine serves new
paraphrases), a "different" one withdraws it, and a person can revert a promotion."""

from __future__ import annotations

import pytest

from cache_layer import promotion, services
from cache_layer.models import CachedAnswer, CacheJudgement
from tests.cache_layer.test_services import SCOPE, ask, put

pytestmark = pytest.mark.django_db(transaction=True)  # on-commit work (the exact store, the index) runs

CACHED = "Do you accept wire transfers?"
ANSWER = "Yes: choose bank transfer at checkout; we ship once it arrives."
# Cosines to CACHED as the cache embeds them here (raw text): no rule serves either ("fine" is a
# word the same-slots rule cannot account for), and LATER is not close to NEAR (0.835).
NEAR = "bank transfer payment possible"  # 0.851
LATER = "Is a wire transfer fine?"  # 0.931
LOOK_ALIKE = "Can I pay with PayPal?"  # another payment method: never


def judged(verdict: str) -> CacheJudgement:
    near = services.near_miss(question=NEAR, scope=SCOPE, embedding=None)
    assert near is not None
    judgement_id = promotion.judgement_open(
        scope=SCOPE, entry_id=near.entry_id, question=NEAR, similarity=near.similarity
    )
    assert judgement_id is not None
    row = promotion.judgement_record(judgement_id=judgement_id, verdict=verdict, judge_model="judge-test")
    assert row is not None
    return row


def test_a_near_miss_is_the_closest_entry_no_rule_serves() -> None:
    assert put(CACHED, ANSWER)
    assert ask(NEAR) is None and ask(LATER) is None
    near = services.near_miss(question=NEAR, scope=SCOPE, embedding=None)
    assert near is not None and near.question == CACHED
    assert near.similarity == pytest.approx(0.851, abs=0.005)
    # Never for another slot value, personal data, or the cached question itself.
    assert services.near_miss(question=LOOK_ALIKE, scope=SCOPE, embedding=None) is None
    assert (
        services.near_miss(question="Can I pay order 48213377 by bank transfer?", scope=SCOPE, embedding=None) is None
    )
    assert services.near_miss(question=CACHED, scope=SCOPE, embedding=None) is None


def test_a_same_verdict_promotes_the_pair_and_serves_new_paraphrases() -> None:
    assert put(CACHED, ANSWER)
    row = judged("same")
    entry = CachedAnswer.objects.get(question=CACHED)
    assert entry.verified_cosine == pytest.approx(row.similarity)
    # The judged question has its alias, with the entry's answer and expiry.
    alias = CachedAnswer.objects.get(pk=row.alias_id)
    assert alias.question == NEAR and alias.answer == ANSWER and alias.expires_at == entry.expires_at
    exact = ask(NEAR)
    assert exact is not None and exact.route == "cache.exact" and exact.answer == ANSWER
    # A new paraphrase at or above the verified cosine is served the entry...
    later = ask(LATER)
    assert later is not None and later.rule == "verified" and later.answer == ANSWER and later.entry_id == entry.pk
    # ...and the hard guard and the slots still hold.
    assert ask(LOOK_ALIKE) is None
    assert services.near_miss(question=NEAR, scope=SCOPE, embedding=None) is None  # judged and served now


def test_a_pair_is_judged_once() -> None:
    assert put(CACHED, ANSWER)
    judged("different")
    near = services.near_miss(question=NEAR, scope=SCOPE, embedding=None)
    assert near is not None
    assert promotion.judgement_open(scope=SCOPE, entry_id=near.entry_id, question=NEAR, similarity=0.9) is None
    assert CacheJudgement.objects.count() == 1


def test_a_different_verdict_promotes_nothing() -> None:
    assert put(CACHED, ANSWER)
    row = judged("different")
    assert row.alias_id is None
    assert CachedAnswer.objects.get(question=CACHED).verified_cosine is None
    assert ask(NEAR) is None and ask(LATER) is None


def test_a_different_verdict_above_a_verified_cosine_withdraws_it() -> None:
    assert put(CACHED, ANSWER)
    judged("same")  # verified at 0.851: LATER (0.931) is served
    entry = CachedAnswer.objects.get(question=CACHED)
    assert ask(LATER) is not None
    # A judge later says a question at 0.931 needs another answer: conflicting evidence, trust neither.
    judgement_id = promotion.judgement_open(scope=SCOPE, entry_id=entry.pk, question=LATER, similarity=0.931)
    assert judgement_id is not None
    promotion.judgement_record(judgement_id=judgement_id, verdict="different")
    assert CachedAnswer.objects.get(pk=entry.pk).verified_cosine is None
    assert ask(LATER) is None


def test_reverting_a_promotion_evicts_its_alias_and_its_verified_cosine() -> None:
    assert put(CACHED, ANSWER)
    row = judged("same")
    assert promotion.judgement_revert(judgement_id=row.pk, by="alice")
    assert not CachedAnswer.objects.filter(pk=row.alias_id).exists()
    assert CachedAnswer.objects.get(question=CACHED).verified_cosine is None
    assert ask(NEAR) is None and ask(LATER) is None
    reverted = CacheJudgement.objects.get(pk=row.pk)
    assert reverted.reverted_by == "alice" and reverted.reverted_at is not None
    assert not promotion.judgement_revert(judgement_id=row.pk, by="alice")  # once


def test_an_unknown_verdict_is_refused() -> None:
    assert put(CACHED, ANSWER)
    near = services.near_miss(question=NEAR, scope=SCOPE, embedding=None)
    assert near is not None
    judgement_id = promotion.judgement_open(scope=SCOPE, entry_id=near.entry_id, question=NEAR, similarity=0.86)
    assert judgement_id is not None
    with pytest.raises(ValueError, match="not a judge's verdict"):
        promotion.judgement_record(judgement_id=judgement_id, verdict="maybe")
    assert CacheJudgement.objects.get(pk=judgement_id).verdict == "pending"


def test_the_admin_lists_judgements_and_reverts_a_promotion(admin_client) -> None:
    assert put(CACHED, ANSWER)
    row = judged("same")
    listing = admin_client.get("/admin/cache_layer/cachejudgement/")
    assert listing.status_code == 200 and NEAR in listing.content.decode()
    response = admin_client.post(
        "/admin/cache_layer/cachejudgement/",
        {"action": "revert_selected", "_selected_action": [row.pk]},
        follow=True,
    )
    assert "Reverted 1 promotion(s)." in response.content.decode()
    assert CacheJudgement.objects.get(pk=row.pk).reverted_by == "admin"
    assert ask(LATER) is None
    assert admin_client.get("/admin/cache_layer/cachejudgement/add/").status_code == 403
