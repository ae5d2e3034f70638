"""Which tier answers a remote-bound message, or whether a person must: the tier classifier.

Two parts, the rules first (docs/routing.md, "Choosing the tier"):

1. **Keyword rules** (:class:`TierRule`), read from a JSON file (``KEFU_TIER_RULES_PATH``, default
   ``routing/demo/tier_rules.json``): each has a name (``legal_threat``, ``fraud``,
   ``chargeback``, ``human_request``, ``refund_dispute``...), an action (``handoff`` or a tier),
   English regular expressions matched case-insensitively as whole words (each is wrapped in
   ``\\b(?:...)\\b``) and Chinese substrings. When several rules match, ``handoff`` wins, then the
   highest tier; among equals the first in the file. A rule always wins over the learned model.
2. **A learned classifier**: a multinomial logistic regression over the shared sentence
   embedding of the message (the same unit-norm 384-d vector of the normalised text that the
   router computes once per message, ``Classified.remote``) plus three length features of the raw
   text, trained at start-up on ``routing/demo/tier_labels.jsonl`` (469 shopper messages written
   for kefu, English and Chinese, labelled ``simple`` / ``medium`` / ``complex``; none is taken
   from an evaluation data set). Its confidence is the softmax probability of the top tier.
   Below ``KEFU_TIER_MIN_CONFIDENCE`` the message goes to the **more expensive of the two most
   probable tiers** (measured with ``bench/tier_eval.py``, see :data:`DEFAULT_MIN_CONFIDENCE`).

Pure Python + numpy at inference time (scikit-learn only to train). Django is read only by
:func:`get_classifier`, :func:`routable_tiers` and :func:`choose_tier` (settings).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from cache_layer.embeddings import get_embedder
from lib.fit_memo import fit_key, load_or_fit
from lib.text import CJK
from routing.faq.model import normalise_text
from routing.types import ROUTING_MAX_CHARS
from routing.upstream.tiers import tier_configured, tier_settings

__all__ = [
    "DEFAULT_MIN_CONFIDENCE",
    "HANDOFF",
    "LABELS_PATH",
    "RULES_PATH",
    "TIERS",
    "TierClassifier",
    "TierDecision",
    "TierRule",
    "choose_tier",
    "get_classifier",
    "load_labels",
    "load_rules",
    "nearest_tier",
    "reset_classifier",
    "routable_tiers",
    "text_features",
]

#: Tiers, cheapest first (the order of ``routing.upstream.resilience.TIER_ORDER``).
TIERS: tuple[str, ...] = ("simple", "medium", "complex")
HANDOFF = "handoff"
ACTIONS = (*TIERS, HANDOFF)

RULES_PATH = Path(__file__).resolve().parent.parent / "demo" / "tier_rules.json"
LABELS_PATH = Path(__file__).resolve().parent.parent / "demo" / "tier_labels.jsonl"
#: Where the texts' normalisation lives (part of the fit's memo key with this file).
_FAQ_MODEL_PY = Path(__file__).resolve().parent.parent / "faq" / "model.py"

#: Top-tier probability below which the learned choice is "uncertain" and the more expensive of
#: the two most probable tiers answers. Chosen by ``bench/tier_eval.py`` on out-of-fold
#: predictions over the training split (5-fold), never on the held-out rows, among three policies
#: (top tier anyway, the upper of the top two, always ``medium``) and cuts 0.4-0.8: of those that
#: send <= 5 % of ``complex`` messages to ``simple`` and cost <= 5 % more than the top tier
#: alone, the one that answers the fewest messages below their label (an under-routed message
#: risks a shallow answer; an over-routed one only costs money). Out of fold: 3 under-routed of
#: 352 instead of 6, for +2.6 % cost. Held-out figures: bench/README.md.
DEFAULT_MIN_CONFIDENCE = 0.7

#: Inverse L2 regularisation of the logistic regression (5-fold accuracy on the training split:
#: 96.3 % at C = 1, 96.9-97.2 % from C = 10 to 100; ``bench/tier_eval.py --sweep``).
DEFAULT_C = 30.0

#: The length features (see :func:`text_features`) are standardised on the training rows and
#: multiplied by this, so that the L2 penalty weighs them like a few embedding dimensions.
FEATURE_SCALE = 0.3

_CJK = CJK
_LATIN_WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?")
_QUESTION = re.compile(r"[?？]")
_CLAUSE = re.compile(r"[.!?;,。！？；，、]+")


class SupportsEmbed(Protocol):
    """Anything with ``embed(texts) -> ndarray (len(texts), dim)`` float32, rows of unit norm."""

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


# --- Rules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TierRule:
    """One keyword rule: ``name``, ``action`` (``handoff`` or a tier), the compiled English
    pattern (``None`` when the rule has none) and the Chinese substrings."""

    name: str
    action: str
    en: re.Pattern[str] | None
    zh: tuple[str, ...]

    def matches(self, text: str) -> bool:
        """True when an English pattern matches a whole word run of ``text`` or a Chinese
        substring occurs in it."""
        if self.en is not None and self.en.search(text):
            return True
        return any(s in text for s in self.zh)

    @property
    def rank(self) -> int:
        """Severity: ``handoff`` 3, ``complex`` 2, ``medium`` 1, ``simple`` 0."""
        return len(TIERS) if self.action == HANDOFF else TIERS.index(self.action)


def load_rules(path: str | Path = RULES_PATH) -> tuple[TierRule, ...]:
    """Read and compile a rules file: ``{"rules": [{"name", "action", "en": [regex...],
    "zh": [substring...]}, ...]}`` (other top-level keys are ignored).

    Raises ``django.core.exceptions.ImproperlyConfigured`` naming the file and, where it applies,
    the rule: unreadable file or JSON, a rule without a name, a duplicate name, an unknown action,
    no pattern at all, a pattern that is not a string, an English pattern that does not compile
    (with ``re``'s message), or one that matches the empty string.
    """
    where = f"tier rules file {path}"
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise ImproperlyConfigured(f"{where}: cannot be read as JSON: {e}") from None
    items = raw.get("rules") if isinstance(raw, Mapping) else None
    if not isinstance(items, list):
        raise ImproperlyConfigured(f"{where}: expected an object with a 'rules' list")
    rules: list[TierRule] = []
    seen: set[str] = set()
    for i, item in enumerate(items, 1):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not name.strip():
            raise ImproperlyConfigured(f"{where}: rule #{i} has no name")
        label = f"{where}: rule {name!r}"
        if name in seen:
            raise ImproperlyConfigured(f"{label}: the name is used twice")
        seen.add(name)
        action = item.get("action")
        if action not in ACTIONS:
            raise ImproperlyConfigured(f"{label}: action {action!r} is not one of {', '.join(ACTIONS)}")
        en, zh = item.get("en", []), item.get("zh", [])
        if not isinstance(en, list) or not isinstance(zh, list) or not all(isinstance(p, str) and p for p in en + zh):
            raise ImproperlyConfigured(f"{label}: 'en' and 'zh' must be lists of non-empty strings")
        if not en and not zh:
            raise ImproperlyConfigured(f"{label}: no pattern")
        compiled = None
        if en:
            for p in en:
                try:
                    re.compile(rf"\b(?:{p})\b", re.IGNORECASE)
                except re.error as e:
                    raise ImproperlyConfigured(
                        f"{label}: English pattern {p!r} is not a valid regular expression: {e}"
                    ) from None
                if re.fullmatch(p, "") is not None:  # "a?", "(x)*": would match between any two letters
                    raise ImproperlyConfigured(f"{label}: English pattern {p!r} matches empty text")
            compiled = re.compile(r"\b(?:" + "|".join(f"(?:{p})" for p in en) + r")\b", re.IGNORECASE)
        rules.append(TierRule(name=name, action=action, en=compiled, zh=tuple(zh)))
    return tuple(rules)


def match_rule(text: str, rules: Sequence[TierRule]) -> TierRule | None:
    """The rule that decides ``text``: among the matching rules the most severe (``handoff``,
    then the highest tier), the first in file order among equals; ``None`` when none matches."""
    best: TierRule | None = None
    for rule in rules:
        if (best is None or rule.rank > best.rank) and rule.matches(text):
            best = rule
    return best


# --- Learned model -------------------------------------------------------------------------------


def load_labels(path: str | Path = LABELS_PATH) -> list[tuple[str, str, str]]:
    """Rows of a labels file (JSONL ``{"text", "tier", "locale"}``) as ``(text, tier, locale)``.
    Raises ``ValueError`` naming the line of a row without text or with an unknown tier."""
    out: list[tuple[str, str, str]] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            text, tier = row.get("text"), row.get("tier")
            if not isinstance(text, str) or not text.strip() or tier not in TIERS:
                raise ValueError(f"{path}:{n}: needs a non-empty 'text' and a 'tier' in {TIERS}")
            out.append((text, str(tier), str(row.get("locale", ""))))
    return out


def text_features(text: str) -> np.ndarray:
    """Three length features of the raw message, shape ``(3,)`` float64:

    ``log1p(words)`` (Latin words plus CJK characters / 1.5, about a Chinese word each),
    ``log1p(question marks)`` (``?`` and ``？``), ``log1p(clauses)`` (runs of sentence or clause
    punctuation, plus one). The embedding reads the normalised text (no punctuation) and sees a
    long message and a short one of the same topic as neighbours; these carry what it misses: how
    much is being asked.
    """
    words = len(_LATIN_WORD.findall(text)) + len(_CJK.findall(text)) / 1.5
    questions = len(_QUESTION.findall(text))
    clauses = len(_CLAUSE.findall(text.strip().rstrip(".!?。！？"))) + 1
    return np.log1p(np.array([words, questions, clauses], dtype=np.float64))


@dataclass(frozen=True)
class TierDecision:
    """The classifier's verdict for one message.

    ``tier``: ``simple`` / ``medium`` / ``complex`` or ``handoff``. ``confidence``: 1.0 for a
    rule, else the softmax probability of the learned model's top tier (0..1; with the
    low-confidence rule applied, ``tier`` may differ from that top tier). ``rule``: the rule's
    name, ``None`` for the learned model. ``source``: ``rule``, ``model``, ``low_confidence``
    (the more expensive of the two most probable tiers) or ``only_tier`` (one tier to choose
    from: the model was not asked). ``requested``: the tier the classifier chose when
    :func:`choose_tier` had to move to the nearest configured one, else ``""``.
    """

    tier: str
    confidence: float
    rule: str | None = None
    source: str = "model"
    requested: str = ""

    def describe(self) -> str:
        """Short text for ``Decision.reason`` and logs, e.g. ``tier complex (rule refund_dispute)``."""
        why = f"rule {self.rule}" if self.rule else f"{self.source} p={self.confidence:.2f}"
        moved = f", wanted {self.requested}" if self.requested else ""
        return f"tier {self.tier} ({why}{moved})"


def _normalise(text: str) -> str:
    return normalise_text(text)


class TierClassifier:
    """Keyword rules + a logistic regression over ``[embedding, scaled length features]``.

    Build it with :meth:`train`. Immutable and thread-safe once built (as long as the embedder
    is). Inference: one ``(3, dim + 3)`` matrix-vector product, plus one embedding when no vector
    is given.
    """

    def __init__(
        self,
        *,
        rules: Sequence[TierRule],
        embedder: SupportsEmbed | None,
        weights: np.ndarray,
        bias: np.ndarray,
        feature_mean: np.ndarray,
        feature_std: np.ndarray,
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
    ) -> None:
        """``weights`` ``(3, dim + 3)`` and ``bias`` ``(3,)``: the regression over the classes
        :data:`TIERS`; ``feature_mean`` / ``feature_std`` ``(3,)``: the standardisation of
        :func:`text_features` on the training rows; ``min_confidence`` in [0, 1]."""
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        self.rules = tuple(rules)
        self._embedder = embedder
        self._w = np.asarray(weights, dtype=np.float64)
        self._b = np.asarray(bias, dtype=np.float64).reshape(-1)
        self._mean = np.asarray(feature_mean, dtype=np.float64)
        self._std = np.asarray(feature_std, dtype=np.float64)
        if self._w.shape[0] != len(TIERS) or self._b.shape[0] != len(TIERS):
            raise ValueError(f"weights and bias must have {len(TIERS)} rows, one per tier")
        self.min_confidence = float(min_confidence)

    @property
    def dim(self) -> int:
        """Embedding size expected (384 for the default embedder)."""
        return int(self._w.shape[1] - 3)

    @classmethod
    def train(
        cls,
        embedder: SupportsEmbed,
        *,
        rules: Sequence[TierRule] | None = None,
        labels: Sequence[tuple[str, str]] | None = None,
        vectors: np.ndarray | None = None,
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
        c: float = DEFAULT_C,
    ) -> TierClassifier:
        """Fit the regression on ``labels`` (``(text, tier)`` pairs; ``None`` reads
        :data:`LABELS_PATH`) and keep ``rules`` (``None`` reads :data:`RULES_PATH`).

        The texts are embedded normalised, as the router embeds a message, in one ``embed`` call
        (the default embedder memoises such a batch on disk: ~2.5 s the first time on 2 cores,
        one file read after). ``vectors`` ``(len(labels), dim)`` skips that (benchmarks). Classes
        are weighted inversely to their sizes. Deterministic for equal inputs.
        """
        from sklearn.linear_model import LogisticRegression

        rows = [(t, tier) for t, tier, _ in load_labels()] if labels is None else list(labels)

        def fit() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            texts = [t for t, _ in rows]
            y = np.array([TIERS.index(tier) for _, tier in rows], dtype=np.int64)
            vecs = vectors
            if vecs is None:
                vecs = np.asarray(embedder.embed([_normalise(t) for t in texts]), dtype=np.float32)
            feats = np.stack([text_features(t) for t in texts])
            mean, std = feats.mean(axis=0), np.maximum(feats.std(axis=0), 1e-6)
            x = np.hstack([np.asarray(vecs, dtype=np.float64), FEATURE_SCALE * (feats - mean) / std])
            model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000)
            model.fit(x, y)
            if list(model.classes_) != list(range(len(TIERS))):
                raise ValueError("tier labels must hold every tier: simple, medium and complex")
            return model.coef_, model.intercept_, mean, std

        embedder_name = getattr(embedder, "name", "")
        if vectors is None and embedder_name:
            # Memoised on disk (lib.fit_memo): a restart loads the fitted arrays. An embedder
            # without a model name (a test's stand-in) is never memoised.
            key = fit_key((tuple(rows), c, embedder_name), (Path(__file__), _FAQ_MODEL_PY))
            weights, bias, mean, std = load_or_fit(settings.KEFU_MODEL_CACHE_DIR, "tier", key, fit)
        else:
            weights, bias, mean, std = fit()
        return cls(
            rules=load_rules() if rules is None else rules,
            embedder=embedder,
            weights=weights,
            bias=bias,
            feature_mean=mean,
            feature_std=std,
            min_confidence=min_confidence,
        )

    # --- inference --------------------------------------------------------------------------

    def probabilities(self, vectors: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """P(tier) for embeddings ``(n, dim)`` of the normalised ``texts`` (the raw messages, for
        the length features): shape ``(n, 3)``, columns in :data:`TIERS` order, rows sum to 1."""
        v = np.asarray(vectors, dtype=np.float64)
        if v.ndim == 1:
            v = v[None, :]
        if v.shape[1] != self.dim or len(texts) != v.shape[0]:
            raise ValueError(f"expected {len(texts)} vectors of size {self.dim}, got {v.shape}")
        feats = np.stack([text_features(t) for t in texts])
        x = np.hstack([v, FEATURE_SCALE * (feats - self._mean) / self._std])
        z = x @ self._w.T + self._b
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return np.asarray(p / p.sum(axis=1, keepdims=True))

    def decide_from_probabilities(self, p: np.ndarray) -> TierDecision:
        """The learned verdict for one row of :meth:`probabilities`: the top tier when its
        probability reaches ``min_confidence``, else the more expensive of the two top tiers."""
        order = np.argsort(-p, kind="stable")
        top, second = int(order[0]), int(order[1])
        conf = float(p[top])
        if conf >= self.min_confidence:
            return TierDecision(tier=TIERS[top], confidence=conf, source="model")
        return TierDecision(tier=TIERS[max(top, second)], confidence=conf, source="low_confidence")

    def rule_for(self, text: str) -> TierRule | None:
        """The keyword rule that decides ``text`` (see :func:`match_rule`), or ``None``."""
        return match_rule(text, self.rules)

    def classify(self, text: str, vector: np.ndarray | None = None) -> TierDecision:
        """Rules first, then the learned model. ``vector``: the embedding of
        ``normalise_text(text[:ROUTING_MAX_CHARS])`` when the caller has it (the router does);
        ``None`` embeds it here. Text with nothing left after normalisation is ``simple``."""
        rule = self.rule_for(text)
        if rule is not None:
            return TierDecision(tier=rule.action, confidence=1.0, rule=rule.name, source="rule")
        if vector is None:
            norm = _normalise(text[:ROUTING_MAX_CHARS])
            if not norm:
                return TierDecision(tier=TIERS[0], confidence=1.0, source="model")
            embedder = self._embedder
            if embedder is None:
                embedder = get_embedder()
            vector = np.asarray(embedder.embed([norm]), dtype=np.float32)[0]
        return self.decide_from_probabilities(self.probabilities(vector, [text])[0])


# --- Process-wide instance and the router's entry point ------------------------------------------

_lock = threading.Lock()
_classifier: TierClassifier | None = None
_rules_cache: dict[str, tuple[TierRule, ...]] = {}  # rules file path -> compiled rules


def get_classifier() -> TierClassifier:
    """The process's classifier (trained on first use, then kept), from the settings
    ``KEFU_TIER_RULES_PATH`` and ``KEFU_TIER_MIN_CONFIDENCE`` and the shared embedder.
    Raises ``ImproperlyConfigured`` for a bad rules file."""
    global _classifier
    if _classifier is None:
        with _lock:
            if _classifier is None:
                _classifier = TierClassifier.train(
                    get_embedder(),
                    rules=_rules_only(settings.KEFU_TIER_RULES_PATH),
                    min_confidence=settings.KEFU_TIER_MIN_CONFIDENCE,
                )
    return _classifier


def reset_classifier() -> None:
    """Forget the process's classifier; the next :func:`get_classifier` trains a new one (after
    the settings changed, in tests)."""
    global _classifier
    with _lock:
        _classifier = None
        _rules_cache.clear()


def routable_tiers() -> list[str]:
    """The tiers the router may choose up front, cheapest first: configured (model and API key)
    and, except ``simple``, ``dedicated`` (configured with a ``KEFU_<TIER>_MODEL``,
    ``_BASE_URL`` or ``_API_KEY`` of its own). A tier that only inherits ``OPENAI_BASE_URL`` /
    ``OPENAI_API_KEY`` with its default model name stays a fallback (``routing.upstream.resilience``): with
    only those two set, ``simple`` answers everything, as documented. ``KEFU_TIER_ROUTING`` off
    leaves ``simple`` alone (when configured)."""
    out = []
    for tier in TIERS:
        if not tier_configured(tier):
            continue
        if tier == TIERS[0] or (settings.KEFU_TIER_ROUTING and tier_settings(tier).dedicated):
            out.append(tier)
    return out


def nearest_tier(tier: str, available: Sequence[str]) -> str | None:
    """``tier`` when available, else the nearest one above it (``simple`` -> ``medium`` ->
    ``complex``), else the nearest below; ``None`` when ``available`` is empty."""
    if tier in available:
        return tier
    i = TIERS.index(tier)
    for t in (*TIERS[i + 1 :], *reversed(TIERS[:i])):
        if t in available:
            return t
    return None


def choose_tier(text: str, vector: np.ndarray | None = None) -> TierDecision | None:
    """The router's entry point (blocking: may train the classifier on first use).

    ``None``: no tier can be chosen (none configured). Otherwise a :class:`TierDecision` whose
    ``tier`` is ``handoff`` (a handoff rule matched) or a routable tier (:func:`routable_tiers`):
    the classifier's choice, moved to the nearest routable tier when it is not one (``requested``
    then names the original). With one routable tier only the rules are consulted (``source``
    ``only_tier`` unless a rule matched).
    """
    available = routable_tiers()
    if not available:
        return None
    if len(available) == 1:
        rule = match_rule(text, _rules_only(settings.KEFU_TIER_RULES_PATH))
        if rule is not None:
            decision = TierDecision(tier=rule.action, confidence=1.0, rule=rule.name, source="rule")
        else:
            decision = TierDecision(tier=available[0], confidence=1.0, source="only_tier")
    else:
        decision = get_classifier().classify(text, vector)
    if decision.tier == HANDOFF:
        return decision
    chosen = nearest_tier(decision.tier, available)
    assert chosen is not None
    return decision if chosen == decision.tier else replace(decision, tier=chosen, requested=decision.tier)


def _rules_only(path: str | Path) -> tuple[TierRule, ...]:
    """The rules of ``path``, compiled once per path (until :func:`reset_classifier`)."""
    key = str(path)
    if key not in _rules_cache:
        _rules_cache[key] = load_rules(path)
    return _rules_cache[key]


def rule_for(text: str) -> TierRule | None:
    """The keyword rule (settings' rules file) that decides ``text``, or ``None``; cheap (regex
    and substring search), for the router's handoff check."""
    return match_rule(text, _rules_only(settings.KEFU_TIER_RULES_PATH))
