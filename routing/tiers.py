"""The remote tiers (``simple`` / ``medium`` / ``complex``): which are configured and the provider
that calls each.

A tier is configured when it has an API key and a model (``settings.KEFU_TIERS``; a tier without
its own base URL or key uses ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, config/settings.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings

from .providers.base import Provider, ProviderConfig

if TYPE_CHECKING:
    from .providers.openai_remote import OpenAIProvider

#: The tiers from cheapest to strongest; a fallback moves up this order.
TIER_ORDER = ("simple", "medium", "complex")


def tier_configured(tier: str) -> bool:
    """Whether ``tier`` may be called: it has an API key and a model."""
    t = settings.KEFU_TIERS.get(tier) or {}
    return bool(t.get("api_key") and t.get("model"))


def tier_model(tier: str) -> str:
    """The model name ``tier`` calls (``KEFU_<TIER>_MODEL``). Raises ``KeyError`` for an unknown tier."""
    return str(settings.KEFU_TIERS[tier]["model"])


def provider_for(tier: str) -> Provider:
    """The provider that streams ``tier``'s answers, with the tier's base URL, key and timeouts
    (a tier's own ``KEFU_<TIER>_*_TIMEOUT_S``, else ``KEFU_LLM_*_TIMEOUT_S``, in seconds).
    Raises ``KeyError`` for an unknown tier."""
    return _openai_provider(tier)


def _openai_provider(tier: str) -> OpenAIProvider:
    # Imported at first use, not at the top: importing the openai SDK takes ~1.2 s, which the
    # management commands and Celery beat would pay for nothing (the server's warm-up pays it
    # at start, routing.warmup).
    from .providers.openai_remote import OpenAIProvider

    t = settings.KEFU_TIERS[tier]
    return OpenAIProvider(
        ProviderConfig(
            base_url=t["base_url"] or None,
            api_key=t["api_key"],
            connect_timeout_s=t.get("connect_timeout_s") or settings.KEFU_LLM_CONNECT_TIMEOUT_S,
            first_token_timeout_s=t.get("first_token_timeout_s") or settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S,
            total_timeout_s=t.get("total_timeout_s") or settings.KEFU_LLM_TOTAL_TIMEOUT_S,
        )
    )
