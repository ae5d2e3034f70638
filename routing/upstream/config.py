"""The tiers' settings as typed, frozen values, validated once when the settings are built.

``config/settings.py`` reads the ``KEFU_<TIER>_*`` variables and builds ``KEFU_TIERS``, a mapping
tier name -> :class:`TierConfig`, with :func:`tier_config`, which raises ``ImproperlyConfigured``
naming the variable and its bad value. The router reads them through ``routing.upstream.tiers``.

Units: prices in USD per million tokens (the providers' list prices), timeouts in seconds, limits
per minute. Default models and prices, with their sources: ``routing/upstream/catalog.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Deployment:
    """One model a tier may call: ``model`` (the name sent upstream), ``base_url`` (an
    OpenAI-compatible endpoint, ``http(s)://...``; ``""``: the SDK's default) and ``api_key``
    (``""``: not callable), and its list prices in USD per million tokens (``>= 0``): uncached
    input, cached input, output."""

    model: str
    base_url: str
    api_key: str
    price_input_per_mtok: float
    price_cached_input_per_mtok: float
    price_output_per_mtok: float


#: The price fields of a :class:`Deployment`.
PRICE_FIELDS = frozenset({"price_input_per_mtok", "price_cached_input_per_mtok", "price_output_per_mtok"})


@dataclass(frozen=True)
class Canary:
    """A tier's candidate model (``KEFU_<TIER>_CANARY_*``, routing.upstream.canary): what it sets
    for itself, each empty or ``None`` where it uses the tier's own value (read at the time of the
    call), and ``share``, the share (0..1; 0 = off) of the tier's conversations it answers.
    ``model`` empty: no candidate."""

    model: str = ""
    base_url: str = ""
    api_key: str = ""
    price_input_per_mtok: float | None = None
    price_cached_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None
    share: float = 0.0


@dataclass(frozen=True)
class TierConfig:
    """One tier (``simple`` / ``medium`` / ``complex``): its own deployment (``current``), its
    canary, and what the tier sets for both deployments.

    ``max_concurrency`` (streams at once per process), ``rpm`` (requests per minute), ``tpm``
    (tokens per minute): client-side limits (routing.upstream.throttle), 0 = none of ours, each
    ``>= 0``. ``connect_timeout_s``, ``first_token_timeout_s``, ``total_timeout_s``: the tier's
    own timeouts in seconds, 0 = the ``KEFU_LLM_*`` value at the time of the call, each ``>= 0``.
    ``day_cap_usd``: store-wide spend cap per day, USD (routing.upstream.budgets), 0 = none.
    ``dedicated``: configured on its own (model, base URL or key set for the tier), so the tier
    classifier may choose it up front and a fallback may go to it; a tier that only inherits
    ``OPENAI_*`` answers only as the ``simple`` tier.

    ``preferences``: empty when ``KEFU_<TIER>_MODEL`` names the model (``current.model``); else
    kefu's preference list (routing.upstream.catalog), of which the first model the endpoint's
    ``GET /models`` lists answers (routing.upstream.listing; ``current.model`` is the list's first,
    used while the list is not known). ``named_prices``: the :class:`Deployment` price fields the
    environment set (``KEFU_<TIER>_PRICE_*``); the others follow the model the list chose.
    """

    name: str
    current: Deployment
    canary: Canary = field(default_factory=Canary)
    max_concurrency: int = 0
    rpm: int = 0
    tpm: int = 0
    connect_timeout_s: float = 0.0
    first_token_timeout_s: float = 0.0
    total_timeout_s: float = 0.0
    day_cap_usd: float = 0.0
    dedicated: bool = False
    preferences: tuple[str, ...] = ()
    named_prices: frozenset[str] = PRICE_FIELDS

    @property
    def candidate(self) -> Deployment:
        """The canary's deployment: the canary's model, base URL, key and prices where it sets
        them, the tier's own elsewhere."""
        c, own = self.canary, self.current
        return Deployment(
            model=c.model or own.model,
            base_url=c.base_url or own.base_url,
            api_key=c.api_key or own.api_key,
            price_input_per_mtok=own.price_input_per_mtok if c.price_input_per_mtok is None else c.price_input_per_mtok,
            price_cached_input_per_mtok=own.price_cached_input_per_mtok
            if c.price_cached_input_per_mtok is None
            else c.price_cached_input_per_mtok,
            price_output_per_mtok=own.price_output_per_mtok
            if c.price_output_per_mtok is None
            else c.price_output_per_mtok,
        )

    def with_current(self, **changes: object) -> TierConfig:
        """This tier with fields of its own deployment changed (``dataclasses.replace`` one level
        down), e.g. ``cfg.with_current(api_key="")``. Giving ``model`` names it: the preference
        list no longer applies and the prices are the deployment's."""
        current = replace(self.current, **changes)  # type: ignore[arg-type]
        if "model" in changes:
            return replace(self, current=current, preferences=(), named_prices=PRICE_FIELDS)
        return replace(self, current=current)

    def with_canary(self, **changes: object) -> TierConfig:
        """This tier with fields of its canary changed, e.g. ``cfg.with_canary(share=0.1)``."""
        return replace(self, canary=replace(self.canary, **changes))  # type: ignore[arg-type]

    def validate(self) -> None:
        """Raise ``ImproperlyConfigured`` naming the first ``KEFU_<TIER>_*`` variable whose value
        is out of its range (class docstrings), with that value."""
        prefix = f"KEFU_{self.name.upper()}_"
        own, c = self.current, self.canary
        checks: list[tuple[str, object, bool, str]] = [
            ("PRICE_INPUT", own.price_input_per_mtok, own.price_input_per_mtok >= 0, _PRICE),
            ("PRICE_CACHED_INPUT", own.price_cached_input_per_mtok, own.price_cached_input_per_mtok >= 0, _PRICE),
            ("PRICE_OUTPUT", own.price_output_per_mtok, own.price_output_per_mtok >= 0, _PRICE),
            ("MAX_CONCURRENCY", self.max_concurrency, self.max_concurrency >= 0, _COUNT),
            ("RPM", self.rpm, self.rpm >= 0, _COUNT),
            ("TPM", self.tpm, self.tpm >= 0, _COUNT),
            ("CONNECT_TIMEOUT_S", self.connect_timeout_s, self.connect_timeout_s >= 0, _TIER_TIMEOUT),
            ("FIRST_TOKEN_TIMEOUT_S", self.first_token_timeout_s, self.first_token_timeout_s >= 0, _TIER_TIMEOUT),
            ("TOTAL_TIMEOUT_S", self.total_timeout_s, self.total_timeout_s >= 0, _TIER_TIMEOUT),
            ("DAY_CAP_USD", self.day_cap_usd, self.day_cap_usd >= 0, "0 (no cap) or more USD"),
            ("CANARY_SHARE", c.share, 0.0 <= c.share <= 1.0, "from 0 to 1 (a share of conversations)"),
        ]
        for suffix, price in (
            ("CANARY_PRICE_INPUT", c.price_input_per_mtok),
            ("CANARY_PRICE_CACHED_INPUT", c.price_cached_input_per_mtok),
            ("CANARY_PRICE_OUTPUT", c.price_output_per_mtok),
        ):
            checks.append((suffix, price, price is None or price >= 0, _PRICE))
        for suffix, value, ok, expected in checks:
            if not ok:
                raise ImproperlyConfigured(f"{prefix}{suffix}={value} must be {expected}")
        check_base_url(f"{prefix}CANARY_BASE_URL", c.base_url)


_PRICE = "0 or more (USD per million tokens)"
_COUNT = "0 (no limit of ours) or more"
_TIER_TIMEOUT = "0 (the KEFU_LLM_* value) or more seconds"


def check_base_url(name: str, value: str) -> None:
    """Raise ``ImproperlyConfigured`` naming ``name`` unless ``value`` is empty (the default) or an
    ``http://`` / ``https://`` URL with a host."""
    if not value:
        return
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ImproperlyConfigured(f"{name}={value!r} must be an http:// or https:// URL")


def check_timeout(name: str, value: float) -> None:
    """Raise ``ImproperlyConfigured`` naming ``name`` unless ``value`` (seconds) is above 0."""
    if not value > 0:
        raise ImproperlyConfigured(f"{name}={value} must be a positive number of seconds")


def tier_config(
    name: str,
    *,
    current: Deployment,
    own_base_url: str,
    canary: Canary,
    max_concurrency: int,
    rpm: int,
    tpm: int,
    connect_timeout_s: float,
    first_token_timeout_s: float,
    total_timeout_s: float,
    day_cap_usd: float,
    dedicated: bool,
    preferences: tuple[str, ...] = (),
    named_prices: frozenset[str] = PRICE_FIELDS,
) -> TierConfig:
    """The validated :class:`TierConfig` of tier ``name`` (``own_base_url``: the tier's own
    ``KEFU_<TIER>_BASE_URL``, checked under that name; ``current.base_url`` may be inherited from
    ``OPENAI_BASE_URL``, which its caller checks). Raises ``ImproperlyConfigured`` naming the
    first variable out of range, with its value."""
    check_base_url(f"KEFU_{name.upper()}_BASE_URL", own_base_url)
    config = TierConfig(
        name=name,
        current=current,
        canary=canary,
        max_concurrency=max_concurrency,
        rpm=rpm,
        tpm=tpm,
        connect_timeout_s=connect_timeout_s,
        first_token_timeout_s=first_token_timeout_s,
        total_timeout_s=total_timeout_s,
        day_cap_usd=day_cap_usd,
        dedicated=dedicated,
        preferences=preferences,
        named_prices=named_prices,
    )
    config.validate()
    return config
