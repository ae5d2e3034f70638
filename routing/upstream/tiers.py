"""The remote tiers (``simple`` / ``medium`` / ``complex``): which are configured and the provider
that calls each.

A tier is configured when it has an API key and a model its endpoint may be called with
(``settings.KEFU_TIERS``, tier name -> ``routing.upstream.config.TierConfig``; a tier without its own
base URL or key uses ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, config/settings.py): the endpoint's
``GET /models`` lists it, or could not be read (routing.upstream.listing). A tier without a named
model uses the first of its preference list the endpoint lists, at that model's prices
(:func:`deployment`). :func:`check_tiers` / :func:`check_tiers_async` ask the endpoints before the
first call. The rest of the router reads the tiers through the functions here.

Each tier has one or two *deployments* (variants): ``current``, the tier's own model, and
``candidate``, the canary model (``KEFU_<TIER>_CANARY_*``; routing.upstream.canary decides which
conversations it answers). A candidate's base URL, key and prices default to its tier's.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING

from django.conf import settings

from routing.providers.base import Provider, ProviderConfig
from routing.upstream import catalog, listing
from routing.upstream.config import Deployment, TierConfig
from routing.upstream.listing import Resolution

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


def configured_deployment(tier: str, variant: str = CURRENT) -> Deployment:
    """One deployment of ``tier`` as configured, before its endpoint's list chose a model: the
    tier's own (``current``), or for ``candidate`` the canary's model, base URL, key and prices
    where it sets them, the tier's elsewhere (:attr:`TierConfig.candidate`). Raises ``KeyError``
    for an unknown tier."""
    t = tier_settings(tier)
    return t.current if variant == CURRENT else t.candidate


def resolution(tier: str, variant: str = CURRENT) -> Resolution:
    """What ``tier``'s deployment may call now (routing.upstream.listing.resolve): its model and
    ``state`` (``unchecked`` / ``on`` / ``unverified`` / ``off``, with a detail naming the
    variable to set). Raises ``KeyError`` for an unknown tier."""
    t = tier_settings(tier)
    prefix = f"KEFU_{tier.upper()}_"
    if variant == CURRENT:
        return listing.resolve(
            t.current,
            preferences=t.preferences,
            variable=f"{prefix}MODEL",
            key_variable=f"{prefix}API_KEY or OPENAI_API_KEY",
        )
    return listing.resolve(
        t.candidate,
        preferences=(),
        variable=f"{prefix}CANARY_MODEL",
        key_variable=f"{prefix}CANARY_API_KEY, {prefix}API_KEY or OPENAI_API_KEY",
    )


def deployment(tier: str, variant: str = CURRENT) -> Deployment:
    """The deployment ``tier`` calls (:func:`configured_deployment`), its model the one its
    endpoint's list chose from the tier's preference list, at that model's list prices
    (routing.upstream.catalog.PRICES) where ``KEFU_<TIER>_PRICE_*`` did not set them. Raises
    ``KeyError`` for an unknown tier."""
    d = configured_deployment(tier, variant)
    if variant != CURRENT or not tier_settings(tier).preferences:
        return d
    model = resolution(tier).model
    if model == d.model:
        return d
    named = tier_settings(tier).named_prices
    listed = catalog.PRICES.get(model)
    prices: dict[str, float] = {}
    if listed is not None:
        for field, price in zip(
            ("price_input_per_mtok", "price_cached_input_per_mtok", "price_output_per_mtok"), listed, strict=True
        ):
            if field not in named:
                prices[field] = price
    return replace(d, model=model, **prices)  # type: ignore[arg-type]


def tier_configured(tier: str) -> bool:
    """Whether ``tier`` may be called: it has an API key and a model, and its endpoint's list
    has the model or could not be read (:func:`resolution`; before the first answer too: the
    caller runs :func:`check_tiers_async` first)."""
    if not known_tier(tier):
        return False
    own = tier_settings(tier).current
    return bool(own.api_key and own.model) and resolution(tier).callable


def candidate_configured(tier: str) -> bool:
    """Whether ``tier`` has a canary candidate that may be called: the tier is configured,
    ``KEFU_<TIER>_CANARY_MODEL`` is set (its key and base URL default to the tier's) and its
    endpoint's list has it or could not be read."""
    return tier_configured(tier) and bool(tier_settings(tier).canary.model) and resolution(tier, CANDIDATE).callable


def _to_check(tiers: list[str] | None = None) -> list[tuple[str, str]]:
    """(tier, variant) of every deployment with a key, of ``tiers`` (None: all known)."""
    found: list[tuple[str, str]] = []
    for tier in TIER_ORDER if tiers is None else tiers:
        if not known_tier(tier):
            continue
        t = tier_settings(tier)
        if t.current.api_key:
            found.append((tier, CURRENT))
            if t.canary.model:
                found.append((tier, CANDIDATE))
    return found


def check_tiers(tiers: list[str] | None = None, *, force: bool = False) -> dict[str, Resolution]:
    """Ask each endpoint of ``tiers``' deployments (None: every tier's) for its models, blocking
    (routing.upstream.listing.check: once per endpoint and process, again with ``force``), and
    log each tier that is off or unverified once. Returns ``"<tier>"`` / ``"<tier> candidate"``
    -> its :class:`Resolution`. Never raises."""
    done: dict[str, Resolution] = {}
    for tier, variant in _to_check(tiers):
        listing.check(configured_deployment(tier, variant), force=force)
        who = tier if variant == CURRENT else f"{tier} candidate"
        done[who] = resolution(tier, variant)
        listing.report(f"the {who} tier" if variant == CURRENT else f"the {tier} tier's candidate", done[who])
    return done


async def check_tiers_async() -> None:
    """:func:`check_tiers` for the deployments whose endpoint has not answered in this process
    yet, in a thread (the event loop never waits on the network here); returns at once when all
    have (the usual case: the warm-up asked at start)."""
    if any(listing.listing(configured_deployment(t, v)) is None for t, v in _to_check()):
        await asyncio.to_thread(check_tiers)


def recheck_tier(tier: str) -> None:
    """Forget what ``tier``'s endpoints answered and ask them again in the background: a canary
    promoted or rolled back. Until the answer, the tier's calls wait for it
    (:func:`check_tiers_async`)."""
    for t, v in _to_check([tier]):
        listing.forget(configured_deployment(t, v))
    threading.Thread(target=check_tiers, args=([tier],), name="kefu-models-recheck", daemon=True).start()


def tier_states() -> dict[str, str]:
    """Each tier's standing for people (``/healthz``, the ops page): ``"ok: <model>"``,
    ``"unverified: ..."``, ``"off: ..."`` (naming the variable to set and the models the
    endpoint offers), ``"checking"`` before the first answer, or ``"not configured: ..."``
    without a key. A candidate is reported as ``"<tier> candidate"`` when off or unverified."""
    states: dict[str, str] = {}
    for tier in TIER_ORDER:
        if not known_tier(tier):
            continue
        if not tier_settings(tier).current.api_key:
            states[tier] = f"not configured: no API key (KEFU_{tier.upper()}_API_KEY or OPENAI_API_KEY)"
            continue
        for variant in (CURRENT, CANDIDATE) if tier_settings(tier).canary.model else (CURRENT,):
            r = resolution(tier, variant)
            who = tier if variant == CURRENT else f"{tier} candidate"
            if r.state == "on":
                states[who] = f"ok: {r.model}"
            elif r.state == "unchecked":
                states[who] = "checking"
            elif r.state == "unverified":
                states[who] = r.detail
            else:
                states[who] = f"off: {r.detail}"
    return states


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
