"""The remote tiers (``simple`` / ``medium`` / ``complex``): which are configured and the provider
that calls each.

A tier is configured when it has an API key and a model (``settings.KEFU_TIERS``, tier name ->
``routing.upstream.config.TierConfig``; a tier without its own base URL or key uses
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, config/settings.py). The rest of the router reads the
tiers through the functions here.

Each tier has one or two *deployments* (variants): ``current``, the tier's own model, and
``candidate``, the canary model (``KEFU_<TIER>_CANARY_*``; routing.upstream.canary decides which
conversations it answers). A candidate's base URL, key and prices default to its tier's.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from typing import TYPE_CHECKING

from django.conf import settings

from routing.providers.base import Provider, ProviderConfig
from routing.upstream.config import Deployment, TierConfig

if TYPE_CHECKING:
    from routing.providers.openai_remote import OpenAIProvider

#: The tiers from cheapest to strongest; a fallback moves up this order.
TIER_ORDER = ("simple", "medium", "complex")

#: A tier's own model (``KEFU_<TIER>_MODEL``) and its canary candidate (``KEFU_<TIER>_CANARY_MODEL``).
CURRENT = "current"
CANDIDATE = "candidate"
VARIANTS = (CURRENT, CANDIDATE)


def tier_settings(tier: str) -> TierConfig:
    """``tier``'s settings (``settings.KEFU_TIERS[tier]``, a frozen :class:`TierConfig` validated
    at start). Raises ``KeyError`` for an unknown tier."""
    config: TierConfig = settings.KEFU_TIERS[tier]
    return config


def known_tier(tier: str) -> bool:
    """Whether ``settings.KEFU_TIERS`` has ``tier`` (configured or not)."""
    return tier in settings.KEFU_TIERS


def deployment(tier: str, variant: str = CURRENT) -> Deployment:
    """One deployment of ``tier``: the tier's own (``current``), or for ``candidate`` the canary's
    model, base URL, key and prices where it sets them, the tier's elsewhere
    (:attr:`TierConfig.candidate`). Raises ``KeyError`` for an unknown tier."""
    t = tier_settings(tier)
    return t.current if variant == CURRENT else t.candidate


def tier_configured(tier: str) -> bool:
    """Whether ``tier`` may be called: it has an API key and a model."""
    if not known_tier(tier):
        return False
    own = tier_settings(tier).current
    return bool(own.api_key and own.model)


def candidate_configured(tier: str) -> bool:
    """Whether ``tier`` has a canary candidate that may be called: the tier is configured and
    ``KEFU_<TIER>_CANARY_MODEL`` is set (its key and base URL default to the tier's)."""
    return tier_configured(tier) and bool(tier_settings(tier).canary.model)


def candidate_share(tier: str) -> float:
    """``KEFU_<TIER>_CANARY_SHARE``: the share of ``tier``'s conversations the environment gives
    its candidate (0 to 1; staff may override it, routing.upstream.canary)."""
    return tier_settings(tier).canary.share


def tier_model_or(tier: str, default: str) -> str:
    """The model name of ``tier``'s own deployment, or ``default`` for an unknown tier or one
    without a model."""
    return (tier_settings(tier).current.model if known_tier(tier) else "") or default


def tier_model(tier: str, variant: str = CURRENT) -> str:
    """The model name ``tier`` calls (``KEFU_<TIER>_MODEL``, or its candidate's
    ``KEFU_<TIER>_CANARY_MODEL``). Raises ``KeyError`` for an unknown tier."""
    return deployment(tier, variant).model


def provider_for(tier: str, variant: str = CURRENT) -> Provider:
    """The provider that streams ``tier``'s answers (or its candidate's), with that deployment's
    base URL and key and the tier's timeouts (a tier's own ``KEFU_<TIER>_*_TIMEOUT_S``, else
    ``KEFU_LLM_*_TIMEOUT_S``, in seconds). Raises ``KeyError`` for an unknown tier."""
    return _openai_provider(tier, variant)


def configured_tiers() -> list[str]:
    """The configured tiers (:func:`tier_configured`), cheapest first."""
    return [tier for tier in TIER_ORDER if tier_configured(tier)]


# event loop -> its keep-warm task (routing.providers.openai_remote.keep_warm)
_keep_warm_tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()


def keep_upstreams_warm() -> None:
    """Start keeping a connection open to every configured tier's upstream (and its candidate's),
    on the running event loop (idempotent; a task that runs until the loop ends):
    ``KEFU_UPSTREAM_KEEPWARM_S`` seconds of no calls to an upstream and it gets a free request
    (0 = off). Nothing until the provider
    module was imported (the router's warm-up does it in a thread), so this never imports the SDK
    on the event loop; the next caller starts it then."""
    every_s = settings.KEFU_UPSTREAM_KEEPWARM_S
    module = sys.modules.get("routing.providers.openai_remote")
    if every_s <= 0 or module is None:
        return
    loop = asyncio.get_running_loop()
    task = _keep_warm_tasks.get(loop)
    if task is not None and not task.done():
        return
    configs = list(
        {
            _openai_provider(tier, variant).config: None
            for tier in configured_tiers()
            for variant in ((CURRENT, CANDIDATE) if candidate_configured(tier) else (CURRENT,))
        }
    )
    if configs:
        _keep_warm_tasks[loop] = loop.create_task(
            module.keep_warm(configs, every_s=every_s), name="kefu-keep-upstreams-warm"
        )


def _openai_provider(tier: str, variant: str = CURRENT) -> OpenAIProvider:
    # Imported at first use, not at the top: importing the openai SDK takes ~1.2 s, which the
    # management commands and Celery beat would pay for nothing (the server's warm-up pays it
    # at start, routing.warmup).
    from routing.providers.openai_remote import OpenAIProvider

    t, d = tier_settings(tier), deployment(tier, variant)
    return OpenAIProvider(
        ProviderConfig(
            base_url=d.base_url or None,
            api_key=d.api_key,
            connect_timeout_s=t.connect_timeout_s or settings.KEFU_LLM_CONNECT_TIMEOUT_S,
            first_token_timeout_s=t.first_token_timeout_s or settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S,
            total_timeout_s=t.total_timeout_s or settings.KEFU_LLM_TOTAL_TIMEOUT_S,
            http2=settings.KEFU_UPSTREAM_HTTP2,
            keepalive_s=settings.KEFU_UPSTREAM_KEEPALIVE_S,
        )
    )
