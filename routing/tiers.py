"""The remote tiers (``simple`` / ``medium`` / ``complex``): which are configured and the provider
that calls each.

A tier is configured when it has an API key and a model (``settings.KEFU_TIERS``; a tier without
its own base URL or key uses ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, config/settings.py).
"""

from __future__ import annotations

import asyncio
import sys
import weakref
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


def configured_tiers() -> list[str]:
    """The configured tiers (:func:`tier_configured`), cheapest first."""
    return [tier for tier in TIER_ORDER if tier_configured(tier)]


# event loop -> its keep-warm task (routing.providers.openai_remote.keep_warm)
_keep_warm_tasks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()


def keep_upstreams_warm() -> None:
    """Start keeping a connection open to every configured tier's upstream, on the running event
    loop (idempotent; a task that runs until the loop ends): ``KEFU_UPSTREAM_KEEPWARM_S`` seconds
    of no calls to an upstream and it gets a free request (0 = off). Nothing until the provider
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
    configs = list({_openai_provider(tier).config: None for tier in configured_tiers()})
    if configs:
        _keep_warm_tasks[loop] = loop.create_task(
            module.keep_warm(configs, every_s=every_s), name="kefu-keep-upstreams-warm"
        )


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
            http2=settings.KEFU_UPSTREAM_HTTP2,
            keepalive_s=settings.KEFU_UPSTREAM_KEEPALIVE_S,
        )
    )
