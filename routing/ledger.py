"""Prices and costs. Money is ``Decimal`` USD; prices are USD per million tokens, per tier, from
``settings.KEFU_TIERS`` (defaults: the providers' list prices, see config/settings.py)."""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings

MTOK = Decimal(1_000_000)
USD_PLACES = Decimal("0.000001")


def cost_usd(*, tier: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> Decimal:
    """Cost of one call in USD (6 decimals): uncached input x input price + cached input x cached
    price + output x output price, each price per million tokens. Raises ``KeyError`` for an unknown tier."""
    t = settings.KEFU_TIERS[tier]
    uncached = max(0, prompt_tokens - cached_prompt_tokens)
    total = (
        Decimal(uncached) * Decimal(str(t["price_input_per_mtok"]))
        + Decimal(cached_prompt_tokens) * Decimal(str(t["price_cached_input_per_mtok"]))
        + Decimal(completion_tokens) * Decimal(str(t["price_output_per_mtok"]))
    ) / MTOK
    return total.quantize(USD_PLACES, rounding=ROUND_HALF_UP)
