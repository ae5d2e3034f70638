"""Trained models memoised on disk (lib.fit_memo): a restart loads the FAQ model, the scope
classifier and the tier classifier that an earlier process trained on the same inputs, and they
decide as freshly trained ones do; changed inputs train again; a torn file is trained again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lib import fit_memo
from routing.decide import tier_classifier
from routing.faq import trainer
from routing.faq.model import FaqModel, FaqTrainingEntry
from routing.faq.scope import ScopeClassifier

ENTRIES = (
    FaqTrainingEntry(1, "shipping_time", "en", ("how long does delivery take", "when will my order arrive")),
    FaqTrainingEntry(2, "returns", "en", ("can I return an item", "what is your return policy")),
    FaqTrainingEntry(3, "payment", "en", ("which cards do you take", "can I pay with paypal")),
)
THRESHOLDS = (0.5, 0.5, 0.5, 0.5)


def test_load_or_fit_fits_once_per_key_and_keeps_the_newest_files(tmp_path: Path) -> None:
    calls: list[str] = []

    def fit(value: str) -> Any:
        def run() -> dict[str, str]:
            calls.append(value)
            return {"fitted": value}

        return run

    assert fit_memo.load_or_fit(tmp_path, "m", "k1", fit("a")) == {"fitted": "a"}
    assert fit_memo.load_or_fit(tmp_path, "m", "k1", fit("b")) == {"fitted": "a"}  # read back
    assert calls == ["a"]
    (tmp_path / "m-k1.pickle").write_bytes(b"torn")
    assert fit_memo.load_or_fit(tmp_path, "m", "k1", fit("c")) == {"fitted": "c"}  # fitted again
    assert fit_memo.load_or_fit(tmp_path, "m", "k1", fit("d")) == {"fitted": "c"}  # and replaced
    for i in range(fit_memo.KEEP_PER_NAME + 3):
        fit_memo.load_or_fit(tmp_path, "m", f"n{i}", fit(str(i)))
    assert len(list(tmp_path.glob("m-*.pickle"))) == fit_memo.KEEP_PER_NAME
    assert (tmp_path / f"m-n{fit_memo.KEEP_PER_NAME + 2}.pickle").exists()
    assert fit_memo.load_or_fit(None, "m", "k1", fit("e")) == {"fitted": "e"}  # no directory: no memo


def test_fit_key_changes_with_inputs_and_with_the_files_that_define_the_fit(tmp_path: Path) -> None:
    code = tmp_path / "model.py"
    code.write_text("C = 1\n")
    first = fit_memo.fit_key((ENTRIES, THRESHOLDS), [code])
    assert fit_memo.fit_key((ENTRIES, THRESHOLDS), [code]) == first
    assert fit_memo.fit_key((ENTRIES, (0.6, 0.5, 0.5, 0.5)), [code]) != first
    code.write_text("C = 2\n")
    assert fit_memo.fit_key((ENTRIES, THRESHOLDS), [code]) != first


def test_a_second_process_loads_the_faq_models_and_they_decide_as_trained_ones(tmp_path, settings, monkeypatch):
    settings.KEFU_MODEL_CACHE_DIR = str(tmp_path)
    model, scope = trainer.train_here(ENTRIES, THRESHOLDS)
    assert len(list(tmp_path.glob("faq-*.pickle"))) == 1

    def no_training(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("trained again although equal inputs were memoised")

    monkeypatch.setattr(FaqModel, "train", no_training)
    monkeypatch.setattr(ScopeClassifier, "train", no_training)
    loaded, loaded_scope = trainer.train_here(ENTRIES, THRESHOLDS)
    assert loaded is not model and loaded.version == model.version
    for text in ("when does my parcel arrive", "do you accept paypal", "who won the match yesterday"):
        a, b = model.match(text, locale="en"), loaded.match(text, locale="en")
        assert (a.entry_id, a.reason, a.accepted) == (b.entry_id, b.reason, b.accepted)
        assert a.confidence == pytest.approx(b.confidence, abs=1e-6)
        assert scope.classify(text).probability == pytest.approx(loaded_scope.classify(text).probability, abs=1e-6)
    with pytest.raises(AssertionError, match="trained again"):  # an added phrasing is a new key
        trainer.train_here((*ENTRIES, FaqTrainingEntry(4, "gift", "en", ("do you gift wrap",))), THRESHOLDS)


def test_the_tier_classifier_is_loaded_by_the_next_process_and_classifies_alike(tmp_path, settings, monkeypatch):
    settings.KEFU_MODEL_CACHE_DIR = str(tmp_path)
    embedder = tier_classifier.get_embedder()
    trained = tier_classifier.TierClassifier.train(embedder)
    assert len(list(tmp_path.glob("tier-*.pickle"))) == 1
    monkeypatch.setattr("sklearn.linear_model.LogisticRegression.fit", lambda *a, **k: pytest.fail("fitted again"))
    loaded = tier_classifier.TierClassifier.train(embedder)
    for text in ("hi", "compare these two laptops for video editing and gaming over five years", "refund?"):
        assert trained.classify(text) == loaded.classify(text)
