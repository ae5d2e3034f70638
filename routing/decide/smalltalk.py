"""Small talk kefu answers itself, in every language of ``KEFU_LANGUAGES``: greetings, "how are
you", thanks, compliments, "are you a bot?", jokes and goodbyes get a short reply of kefu's own
(route ``decline``: no FAQ answer, no remote model, no person), and whatever the conversation was
doing (a pending order task) is left as it was.

The classifier works over the embeddings routing already computes (the message's vector from
``routing.decide.classify``): a logistic regression of small talk (the examples of
``routing/demo/smalltalk_seed.json``, written for kefu) against store questions (the in-scope
examples of the scope seed, ``routing/demo/scope_seed.json``, and the demo FAQ's phrasings), over
the vector plus its closest cosine to each side (``NEIGHBOUR_SCALE`` times); a message is small talk when
P(small talk) >= ``MIN_PROBABILITY`` and its closest small-talk example is at cosine
``MIN_SIMILARITY`` or more. The reply is that example's category's, in the message's language
(English when the seed has none in it). Both numbers were chosen on CLINC150's ``val`` small-talk
and meta rows and on the even Bitext rows (bench/smalltalk_eval.py --sweep; figures in
bench/README.md), never on the rows the figures are measured on.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routing.decide.replies import SMALL_TALK

SEED_PATH = Path(__file__).resolve().parent.parent / "demo" / "smalltalk_seed.json"
STORE_PATH = Path(__file__).resolve().parent.parent / "demo" / "scope_seed.json"
FAQ_PATH = Path(__file__).resolve().parent.parent / "demo" / "faq_demo.jsonl"

#: Least P(small talk) of the logistic regression (bench/smalltalk_eval.py --sweep).
MIN_PROBABILITY = 0.60
#: Least cosine between a message and its closest small-talk example (bench/smalltalk_eval.py --sweep).
MIN_SIMILARITY = 0.80
#: Weight of the two closest-cosine features against the vector's own (as the scope classifier's).
NEIGHBOUR_SCALE = 10.0
#: Inverse regularisation of the logistic regression (scikit-learn's ``C``).
C = 1.0
#: Longest small talk, in words (CJK: characters / 3): "hi, can you tell me where my order is" is
#: a store question that starts with a greeting. The longest seed example has 9 words.
MAX_WORDS = 12
#: Digits or an ``@`` (an order number, an e-mail, a size, a price) make a message a store matter.
_REFERENCE = re.compile(r"\d|@")
#: A connective opener makes a message a follow-up to the conversation, not small talk ("y el
#: azul?", "and the blue one?", "那红色的呢"), whatever its closest example.
_FOLLOW_UP = re.compile(
    r"^[¿¡\s]*(?:(?:and|or|but|also|what about|how about|y|o|pero|et|ou|mais|und|oder|aber|e|ma|en|of|maar"
    r"|и|а|или|но)\b|那|还有|另外|それ|그럼|그리고)",
    re.IGNORECASE,
)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


@dataclass(frozen=True)
class SmallTalk:
    """A message taken as small talk: ``category`` (a key of the seed's ``categories``:
    ``greeting``, ``how_are_you``, ``thanks``, ``compliment``, ``bot``, ``joke``, ``goodbye``,
    ``assistant_settings``, ``acknowledgement``),
    ``similarity`` to its closest example (cosine, 0..1; 1.0 for the exact greeting rule) and
    ``reply``, kefu's answer in the message's language."""

    category: str
    similarity: float
    reply: str


class SmallTalkClassifier:
    """Small talk against store questions, over unit-norm embeddings.

    ``examples`` ``(n, dim)`` with ``categories`` (``n`` names), ``store`` ``(m, dim)``,
    ``weights`` ``(dim + 2,)`` and ``bias``: the logistic regression for P(small talk) over
    :meth:`features`, ``replies``: category -> locale -> text
    (each category has an ``"en"`` reply)."""

    def __init__(
        self,
        *,
        examples: np.ndarray,
        categories: list[str],
        store: np.ndarray,
        weights: np.ndarray,
        bias: float,
        replies: dict[str, dict[str, str]],
        min_probability: float = MIN_PROBABILITY,
        min_similarity: float = MIN_SIMILARITY,
    ) -> None:
        if len(examples) != len(categories):
            raise ValueError("one category per example")
        if any("en" not in r for r in replies.values()):
            raise ValueError("every small-talk category needs an English reply")
        self._examples = np.asarray(examples, dtype=np.float32)
        self._categories = categories
        self._store = np.asarray(store, dtype=np.float32)
        self._w = np.asarray(weights, dtype=np.float32).reshape(-1)
        self._b = float(bias)
        self.replies = replies
        self.min_probability = min_probability
        self.min_similarity = min_similarity

    def features(self, vectors: np.ndarray, *, skip_talk: bool = False, skip_store: bool = False) -> np.ndarray:
        """``(n, dim + 2)``: each vector, then ``NEIGHBOUR_SCALE`` x its closest cosine to a
        small-talk example and to a store question. ``skip_talk`` / ``skip_store``: the rows are
        that side's own training examples, whose closest example there is themselves: their
        second closest is taken."""
        out = [np.asarray(vectors, dtype=np.float32)]
        for side, skip in ((self._examples, skip_talk), (self._store, skip_store)):
            sims = np.sort(vectors @ side.T, axis=1)
            k = 2 if skip else 1
            column = sims[:, -k] if sims.shape[1] >= k else np.zeros(len(vectors), dtype=np.float32)
            out.append(NEIGHBOUR_SCALE * column[:, None])
        return np.hstack(out).astype(np.float32)

    def scores(self, vector: np.ndarray) -> tuple[str, float, float]:
        """``(closest category, its cosine, P(small talk))`` for ``vector``."""
        sims = self._examples @ vector
        best = int(np.argmax(sims))
        z = float(self._w @ self.features(vector[None, :])[0]) + self._b
        return self._categories[best], float(sims[best]), 1.0 / (1.0 + float(np.exp(-z)))

    def reply(self, category: str, locale: str) -> str:
        """Kefu's reply for ``category`` in ``locale``, else in English."""
        texts = self.replies[category]
        return texts.get(locale) or texts["en"]

    def classify(self, text: str, vector: np.ndarray | None, locale: str) -> SmallTalk | None:
        """``text`` as small talk (:class:`SmallTalk`), or ``None`` for anything else. ``vector``:
        the embedding of ``normalise_text(text)`` (None: only the exact greeting rule applies)."""
        if _REFERENCE.search(text) or _FOLLOW_UP.match(text) or _words(text) > MAX_WORDS:
            return None
        if SMALL_TALK.match(text):
            return SmallTalk(_rule_category(text), 1.0, self.reply(_rule_category(text), locale))
        if vector is None:
            return None
        category, similarity, p = self.scores(np.asarray(vector, dtype=np.float32))
        if p < self.min_probability or similarity < self.min_similarity:
            return None
        return SmallTalk(category, similarity, self.reply(category, locale))


def _words(text: str) -> int:
    return len(text.split()) + len(_CJK.findall(text)) // 3


def _rule_category(text: str) -> str:
    low = text.lower()
    if any(w in low for w in ("bye", "see you", "再见", "拜拜")):
        return "goodbye"
    if any(w in low for w in ("thank", "thx", "cheers", "谢", "ty")):
        return "thanks"
    return "greeting"


def load_seed(path: Path = SEED_PATH) -> dict[str, dict[str, dict[str, list[str]] | dict[str, str]]]:
    """The seed's ``categories``: name -> ``{"replies": {locale: text}, "examples": {locale:
    [text, ...]}}``. Raises ``ValueError`` when a category lacks either part."""
    raw = json.loads(path.read_text(encoding="utf-8"))["categories"]
    for name, part in raw.items():
        if not part.get("replies") or not part.get("examples"):
            raise ValueError(f"small-talk category {name!r} needs replies and examples")
    return dict(raw)


def build(embed: object = None) -> SmallTalkClassifier:
    """Train the classifier from the seeds: embeds every example and store question once (~700
    texts; memoised on disk by the embedder). ``embed``: a callable ``list[str] -> (n, dim)``
    array (default: the process's embedder)."""
    from cache_layer.embeddings import get_embedder
    from routing.faq.model import normalise_text

    embed_fn = embed if callable(embed) else get_embedder().embed
    seed = load_seed()
    texts, categories = [], []
    replies: dict[str, dict[str, str]] = {}
    for name, part in seed.items():
        replies[name] = dict(part["replies"])  # type: ignore[arg-type]
        for examples in part["examples"].values():
            for example in examples:
                texts.append(normalise_text(example))
                categories.append(name)
    store_seed = json.loads(STORE_PATH.read_text(encoding="utf-8"))["in_scope"]
    store = [normalise_text(q) for qs in store_seed.values() for q in qs]
    for line in FAQ_PATH.read_text(encoding="utf-8").splitlines():
        if line.strip():
            entry = json.loads(line)
            store += [normalise_text(q) for q in (entry["question"], *entry.get("variants", []))]
    from sklearn.linear_model import LogisticRegression

    talk = np.asarray(embed_fn(texts), dtype=np.float32)
    questions = np.asarray(embed_fn(store), dtype=np.float32)
    untrained = SmallTalkClassifier(
        examples=talk,
        categories=categories,
        store=questions,
        weights=np.zeros(talk.shape[1] + 2),
        bias=0.0,
        replies=replies,
    )
    x = np.vstack([untrained.features(talk, skip_talk=True), untrained.features(questions, skip_store=True)])
    model = LogisticRegression(C=C, class_weight="balanced", max_iter=5000)
    model.fit(x, np.r_[np.ones(len(talk)), np.zeros(len(questions))])
    return SmallTalkClassifier(
        examples=talk,
        categories=categories,
        store=questions,
        weights=model.coef_[0],
        bias=float(model.intercept_[0]),
        replies=replies,
    )


_lock = threading.Lock()
_classifier: SmallTalkClassifier | None = None


def classifier() -> SmallTalkClassifier:
    """The process's classifier, built at first use (the router's warm-up builds it)."""
    global _classifier
    if _classifier is None:
        with _lock:
            if _classifier is None:
                _classifier = build()
    return _classifier


def small_talk(text: str, vector: np.ndarray | None, locale: str) -> SmallTalk | None:
    """``text`` (embedded as ``vector``, in ``locale``) as small talk, or ``None``
    (:meth:`SmallTalkClassifier.classify` on the process's classifier)."""
    return classifier().classify(text, vector, locale)
