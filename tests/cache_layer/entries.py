"""Cached answers as the remote path stores them, for the cache tests (one place for the
arguments ``services.store`` takes)."""

from __future__ import annotations

import numpy as np

from cache_layer import services


def store_answer(
    question: str,
    answer: str,
    *,
    scope: str,
    model: str = "gpt-test",
    cut: bool = False,
    grounded_on: list[int] | None = None,
    embedding: np.ndarray | None = None,
) -> bool:
    """``services.store`` of a ``simple``-tier answer in English, prompt version ``v1``; returns
    whether it was stored."""
    return services.store(
        question=question,
        answer=answer,
        scope=scope,
        embedding=embedding,
        route="llm.simple",
        model=model,
        grounded_on=grounded_on or [],
        prompt_version="v1",
        cut=cut,
        locale="en",
    )
