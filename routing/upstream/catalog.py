"""kefu's preference list of models per tier and the list prices of the models in them.

A tier without ``KEFU_<TIER>_MODEL`` uses the first model of :data:`PREFERENCES` that its
endpoint's ``GET /models`` lists (routing.upstream.listing, docs/routing.md); its prices are then
that model's from :data:`PRICES`, unless ``KEFU_<TIER>_PRICE_*`` set them. Each list runs from the
model kefu would rather use, so a store that points kefu at OpenAI, DeepSeek, Gemini's
OpenAI-compatible endpoint or Qwen (Alibaba Cloud Model Studio's compatible mode) gets a cheap
model of that provider on the ``simple`` tier without naming one.

Pure data: ``config/settings.py`` imports it at start.
"""

from __future__ import annotations

#: Tier -> the models it may use when none is named, in order of preference. The ``simple`` tier:
#: the providers' cheapest chat models (non-reasoning ones first: a reasoning model's hidden
#: thinking adds seconds before the first token); ``medium``: their mid models; ``complex``:
#: their strongest general models. Every name is in :data:`PRICES` (tests/routing/test_model_check.py).
PREFERENCES: dict[str, tuple[str, ...]] = {
    "simple": (
        "gpt-4.1-nano",
        "gpt-4o-mini",
        "gpt-5-nano",
        "gpt-5-mini",
        "deepseek-chat",
        "gemini-2.5-flash-lite",
        "gemini-2.0-flash-lite",
        "gemini-2.5-flash",
        "qwen-flash",
        "qwen-turbo",
        "qwen-plus",
    ),
    "medium": (
        "gpt-4.1-mini",
        "gpt-5-mini",
        "gpt-4o-mini",
        "deepseek-chat",
        "gemini-2.5-flash",
        "gemini-2.0-flash",
        "qwen-plus",
    ),
    "complex": (
        "gpt-4.1",
        "gpt-5",
        "gpt-4o",
        "deepseek-chat",
        "gemini-2.5-pro",
        "gemini-2.5-flash",
        "qwen-max",
        "qwen-plus",
    ),
}

#: Model -> list prices in USD per million tokens: (input, cached input, output), standard
#: (non-batch) tier, prompts up to 200k tokens where a price has steps. Sources (deepseek-chat,
#: gemini-2.5-flash and gpt-4.1 are config/settings.py's former defaults, read there on 2026-11-30;
#: the others were written from these pages as known on 2026-12-04 without re-reading them, so check
#: them against the pages before relying on a cost):
#: OpenAI: platform.openai.com/docs/pricing; DeepSeek: api-docs.deepseek.com/quick_start/pricing
#: (V3.2, cache hit / miss); Google: ai.google.dev/gemini-api/docs/pricing (Gemini 2.0 Flash-Lite
#: has no context caching: cached input costs what input does); Alibaba Cloud Model Studio,
#: international (Singapore) deployment: alibabacloud.com/help/en/model-studio/models (its implicit
#: cache bills a hit at 20 % of the input price).
PRICES: dict[str, tuple[float, float, float]] = {
    # OpenAI
    "gpt-4.1-nano": (0.10, 0.025, 0.40),
    "gpt-4o-mini": (0.15, 0.075, 0.60),
    "gpt-5-nano": (0.05, 0.005, 0.40),
    "gpt-5-mini": (0.25, 0.025, 2.00),
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1": (2.00, 0.50, 8.00),
    "gpt-5": (1.25, 0.125, 10.00),
    "gpt-4o": (2.50, 1.25, 10.00),
    # DeepSeek (V3.2)
    "deepseek-chat": (0.28, 0.028, 0.42),
    "deepseek-reasoner": (0.28, 0.028, 0.42),
    # Google Gemini
    "gemini-2.5-flash-lite": (0.10, 0.01, 0.40),
    "gemini-2.0-flash-lite": (0.075, 0.075, 0.30),
    "gemini-2.0-flash": (0.10, 0.025, 0.40),
    "gemini-2.5-flash": (0.30, 0.03, 2.50),
    "gemini-2.5-pro": (1.25, 0.125, 10.00),
    # Alibaba Cloud Qwen (international)
    "qwen-flash": (0.05, 0.01, 0.40),
    "qwen-turbo": (0.05, 0.01, 0.20),
    "qwen-plus": (0.40, 0.08, 1.20),
    "qwen-max": (1.60, 0.32, 6.40),
}


def first_choice(tier: str) -> str:
    """The model ``tier`` uses when none is named and its endpoint's list is not known (yet, or at
    all: no ``GET /models``): the first of its preference list. Raises ``KeyError`` for an
    unknown tier."""
    return PREFERENCES[tier][0]
