"""Which customer-service intent a question resolves to: the cache's "different resolved intent" guard.

A semantic cache hit is only safe when both questions need the same answer. Cosine cannot tell
"cancel my order" from "change my order" (``bench/cache_guard_eval.py``), and a content-word guard
that can is too strict for real paraphrases ("call off my purchase"). Resolving both questions to
an intent settles most pairs: two questions that confidently resolve to the *same* intent may
share an answer (if their numbers, negation and named things agree, see
:func:`cache_layer.similarity.hard_guard`); two that resolve to *different* intents never do.

The model is a multinomial logistic regression over the shared embeddings (384 dims, unit norm,
the same vectors the FAQ model and the cache use): ``softmax(W @ v + b)`` over the intents of
customer service (orders, refunds, shipping, accounts, invoices, payments, ...) plus one
``other`` class for everything else (product questions, chit-chat, other domains). It is trained
offline by ``bench/train_cache_intents.py`` on the Bitext customer-service set (CDLA-Sharing-1.0)
for the intents, and on CLINC150 (CC BY 3.0) and the project's own scope seed for ``other``; the
weights ship in ``cache_layer/data/cache_intents.npz`` (about 45 kB), so nothing is trained or
downloaded at run time. Measured figures are in that script's docstring and bench/README.md.

English only for now: Chinese questions resolve to ``other`` (no Chinese training data with a
licence that allows it), and fall back to the strict lexical rule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WEIGHTS_PATH = Path(__file__).resolve().parent / "data" / "cache_intents.npz"
OTHER = "other"


@dataclass(frozen=True)
class Resolved:
    """An intent and the model's probability for it (0..1)."""

    intent: str
    confidence: float


class IntentModel:
    """``resolve(vectors)`` -> one :class:`Resolved` per row of a ``(n, dim)`` float32 array.

    ``coef``: ``(n_intents, dim)``; ``intercept``: ``(n_intents,)``; ``classes``: intent names.
    """

    def __init__(self, coef: np.ndarray, intercept: np.ndarray, classes: list[str]) -> None:
        self.coef = np.asarray(coef, dtype=np.float32)
        self.intercept = np.asarray(intercept, dtype=np.float32)
        self.classes = list(classes)
        if self.coef.shape[0] != len(self.classes) or self.intercept.shape[0] != len(self.classes):
            raise ValueError("intent model: coef, intercept and classes disagree in length")

    @property
    def dim(self) -> int:
        return int(self.coef.shape[1])

    @classmethod
    def load(cls, path: Path = WEIGHTS_PATH) -> IntentModel:
        """Raises ``FileNotFoundError`` when the weights are missing."""
        d = np.load(path, allow_pickle=False)
        return cls(d["coef"], d["intercept"], [str(c) for c in d["classes"]])

    def save(self, path: Path = WEIGHTS_PATH, **meta: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            path,
            coef=self.coef.astype(np.float16).astype(np.float32),
            intercept=self.intercept,
            classes=np.array(self.classes),
            **{k: np.array(v) for k, v in meta.items()},  # type: ignore[arg-type]  # numpy's stub: **kwds as bool
        )

    def probabilities(self, vectors: np.ndarray) -> np.ndarray:
        """Softmax probabilities, shape ``(n, n_intents)``."""
        z = np.atleast_2d(np.asarray(vectors, dtype=np.float32)) @ self.coef.T + self.intercept
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def resolve(self, vectors: np.ndarray) -> list[Resolved]:
        p = self.probabilities(vectors)
        best = p.argmax(axis=1)
        return [Resolved(self.classes[int(k)], float(p[i, k])) for i, k in enumerate(best)]


@functools.lru_cache(maxsize=1)
def get_intent_model() -> IntentModel | None:
    """The shipped model, loaded once; ``None`` when its weights file is missing (the cache then
    uses only the lexical rule)."""
    try:
        return IntentModel.load()
    except FileNotFoundError:
        return None
