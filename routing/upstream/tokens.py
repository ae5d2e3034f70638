"""Token counts for prompts and answers, safe to take on the event loop.

Counting is exact with the tier model's tokenizer (``lib.tokens``, tiktoken-compatible). Loading
an encoding takes 2-3 s, which must not happen on the event loop: there, until it is loaded,
tokens are estimated (:func:`estimate_tokens`) and the encoding loads in a background thread;
the start-up warm-up (``routing.warmup``) loads every configured tier's encoding first.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from lib.tokens import count_tokens, encoding_name_for_model

log = logging.getLogger(__name__)

# Encodings known to be loaded in this process (``encoding_name_for_model`` names). Loading one
# takes 2-3 s, which must not happen on the event loop: there, until it is loaded, tokens are
# estimated and the encoding is loaded in a background thread.
_ready: set[str] = set()
_warming: set[str] = set()
_ready_lock = threading.Lock()


def warm_tokenizer(model: str) -> None:
    """Load the tokenizer of ``model`` now (blocking, 2-3 s the first time in a process)."""
    count_tokens("", model)
    with _ready_lock:
        _ready.add(encoding_name_for_model(model))


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _exact_counts(model: str) -> bool:
    """Whether tokens of ``model`` may be counted exactly right now: its encoding is loaded, or
    this thread may block to load it (no event loop runs here). Otherwise starts loading it in
    the background and returns False (the caller estimates)."""
    name = encoding_name_for_model(model)
    with _ready_lock:
        if name in _ready:
            return True
    if not _on_event_loop():
        warm_tokenizer(model)
        return True
    with _ready_lock:
        start = name not in _warming
        _warming.add(name)
    if start:
        threading.Thread(target=_warm_quietly, args=(model,), name="kefu-tokenizer", daemon=True).start()
    return False


def _warm_quietly(model: str) -> None:
    try:
        warm_tokenizer(model)
    except Exception:  # a background warm-up: counting stays estimated, the answer goes on
        log.exception("loading the tokenizer of %s failed", model)


def estimate_tokens(text: str) -> int:
    """A quick upper-leaning estimate of ``text``'s tokens: ceil(UTF-8 bytes / 3). English runs
    at about 4-5 characters a token (so this over-counts), Chinese at about 1-1.5 characters a
    token (3 bytes each: about right)."""
    return math.ceil(len(text.encode("utf-8")) / 3)


def text_tokens(text: str, model: str) -> tuple[int, bool]:
    """Tokens of ``text`` as completion text for ``model``: ``(count, estimated)``. Exact with the
    model's tokenizer; estimated (:func:`estimate_tokens`) on the event loop while it loads."""
    if _exact_counts(model):
        return count_tokens(text, model), False
    return estimate_tokens(text), True


class PromptCounter:
    """Tokens of single chat messages for one model: exact, or estimated while the tokenizer
    loads (``estimated`` then True). A message costs its role and content plus the chat format's
    overhead; the reply priming is counted once per prompt (``priming``)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.exact = _exact_counts(model)
        self.estimated = not self.exact
        self.priming = self._count([]) if self.exact else 3

    def _count(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return count_tokens(messages, self.model)

    def message(self, role: str, content: str) -> int:
        if self.exact:
            return self._count([{"role": role, "content": content}]) - self.priming
        return 3 + estimate_tokens(role) + estimate_tokens(content)
