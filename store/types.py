"""The plain values of the store part: what an adapter returns and the errors it raises.

A store adapter (``store.adapters``) speaks to where the store keeps its orders (the demo store's
own tables, Shopify's Admin GraphQL API...) and returns these frozen dataclasses; nothing here
knows Django or HTTP. Money is ``Decimal`` in the order's currency (ISO 4217 code); times are
aware ``datetime`` in UTC.

Who may see an order is decided by ``store.services`` (the part's door), never by an adapter:
an :class:`Owner` is either a verified customer (their store customer id, from the signed
identity) or an anonymous shopper who gave an order number *and* the e-mail address on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Literal

__all__ = [
    "ACTIONS",
    "MUTATING_ACTIONS",
    "Action",
    "Address",
    "CatalogError",
    "Order",
    "OrderLine",
    "OrderStatus",
    "Owner",
    "ProductNames",
    "ProductVariantView",
    "ProductView",
    "Refund",
    "ReturnRequest",
    "Shipment",
    "StoreError",
    "StoreErrorCode",
]

#: Where an order stands, in the words kefu answers with (an adapter maps its platform's states):
#: ``placed`` (paid, not yet packed: it may still be changed or cancelled), ``packed`` (being
#: prepared: too late to change), ``shipped`` (handed to the carrier), ``delivered``,
#: ``cancelled``, ``returned`` (every item came back).
OrderStatus = Literal["placed", "packed", "shipped", "delivered", "cancelled", "returned"]

#: What a shopper (through the bot) or an agent can do with an order. ``status`` and
#: ``refund_status`` read; the other three change the order and are confirmed first.
Action = Literal["status", "refund_status", "cancel", "return", "change_address"]
ACTIONS: tuple[Action, ...] = ("status", "refund_status", "cancel", "return", "change_address")
MUTATING_ACTIONS: frozenset[str] = frozenset({"cancel", "return", "change_address"})

StoreErrorCode = Literal[
    "not_found",  # no such order for this owner (also: the order exists but is someone else's)
    "not_allowed",  # the order is this owner's, but the action is not possible in its state
    "invalid",  # the request itself is wrong (an empty address, an unknown action)
    "upstream",  # the store's system failed or timed out: try again later or ask a person
    "not_configured",  # no store adapter is set up
]


class StoreError(Exception):
    """A store call that did not do what was asked.

    ``code``: see :data:`StoreErrorCode`; ``message``: for logs and agents (no personal data);
    ``next_step``: what the shopper can do next, in plain English (``"Reply with the order
    number and the e-mail address it was placed with."``), "" when nothing; ``permanent``:
    False when trying again later may work (by default: ``upstream`` only)."""

    def __init__(
        self, code: StoreErrorCode, message: str, *, next_step: str = "", permanent: bool | None = None
    ) -> None:
        super().__init__(message)
        self.code: StoreErrorCode = code
        self.message = message
        self.next_step = next_step
        # By default only an upstream failure is worth trying again; an adapter says otherwise
        # for one that is not (credentials the store refused).
        self.permanent = permanent if permanent is not None else code != "upstream"

    def __repr__(self) -> str:
        return f"StoreError({self.code!r}, {self.message!r})"


@dataclass(frozen=True)
class Owner:
    """Who asks about orders. A verified customer: ``customer_id`` (the signed identity's
    ``sub``), and ``email`` if the identity carried one. An anonymous shopper: ``customer_id``
    "" and the ``email`` they gave with the order number; they may only see that one order,
    and only when the e-mail is the order's (compared case-insensitively)."""

    customer_id: str = ""
    email: str = ""

    @property
    def verified(self) -> bool:
        return bool(self.customer_id)

    def __repr__(self) -> str:  # never print an e-mail address into a log
        return f"Owner(verified={self.verified})"


@dataclass(frozen=True)
class Address:
    """A postal address; ``country`` is an ISO 3166-1 alpha-2 code."""

    name: str
    line1: str
    city: str
    postcode: str
    country: str
    line2: str = ""

    def one_line(self) -> str:
        """``"12 Rue X, 75001 Paris, FR"``: the address as one line (no name)."""
        parts = [self.line1, self.line2, f"{self.postcode} {self.city}".strip(), self.country]
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class OrderLine:
    """One line of an order: ``sku``, ``title``, ``quantity`` (units), ``unit_price`` (the
    order's currency)."""

    sku: str
    title: str
    quantity: int
    unit_price: Decimal


@dataclass(frozen=True)
class Shipment:
    """A parcel handed to a carrier: ``carrier`` ("DHL"), ``tracking_number``, ``tracking_url``
    ("" when the carrier gives none), ``shipped_at``, ``delivered_at`` (None until delivered),
    ``estimated_delivery`` (None when unknown)."""

    carrier: str
    tracking_number: str
    tracking_url: str
    shipped_at: datetime
    delivered_at: datetime | None = None
    estimated_delivery: datetime | None = None


@dataclass(frozen=True)
class Refund:
    """Money going back to the shopper: ``amount`` in ``currency``, ``status`` (``pending``:
    issued by the store, not yet at the bank; ``succeeded``; ``failed``), ``created_at``,
    ``processed_at`` (None until the payment provider settled it)."""

    amount: Decimal
    currency: str
    status: Literal["pending", "succeeded", "failed"]
    created_at: datetime
    processed_at: datetime | None = None


@dataclass(frozen=True)
class ReturnRequest:
    """A return the store opened: ``return_id``, ``status`` (``requested``: label sent, waiting
    for the parcel; ``received``; ``refunded``; ``declined``), ``created_at``, ``label_url``
    ("" when the store e-mails it)."""

    return_id: str
    status: Literal["requested", "received", "refunded", "declined"]
    created_at: datetime
    label_url: str = ""


@dataclass(frozen=True)
class Order:
    """One order as kefu shows it. ``number`` is what the shopper sees ("KF-1001", Shopify's
    "#1001"); ``customer_id`` and ``email`` say whose it is (the door compares them, and never
    shows them to anyone else); ``total`` in ``currency``; ``placed_at`` in UTC."""

    number: str
    customer_id: str
    email: str
    status: OrderStatus
    placed_at: datetime
    total: Decimal
    currency: str
    lines: tuple[OrderLine, ...] = ()
    shipping_address: Address | None = None
    shipments: tuple[Shipment, ...] = ()
    refunds: tuple[Refund, ...] = ()
    returns: tuple[ReturnRequest, ...] = ()
    # Kept so an agent can open the order in the store's own admin ("" when none).
    admin_url: str = ""
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def changeable(self) -> bool:
        """Whether the order may still be cancelled or its address changed (not yet packed)."""
        return self.status == "placed"

    @property
    def returnable(self) -> bool:
        """Whether a return may be opened (delivered, none open already)."""
        return self.status == "delivered" and not any(r.status in ("requested", "received") for r in self.returns)

    def item_count(self) -> int:
        """Units in the order (the sum of line quantities)."""
        return sum(line.quantity for line in self.lines)


class CatalogError(Exception):
    """A catalog request that cannot be served: ``code`` ``invalid`` (a file that cannot be read
    at all) or ``not_found``; ``message`` says what, for logs and the command line."""

    def __init__(self, code: Literal["invalid", "not_found"], message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ProductVariantView:
    """One variant as a shopper is told about it: ``sku``, ``options`` in the asked language
    (``{"colour": "black"}``; the shared ones when that language has none), ``price`` (the
    product's currency), ``stock`` (units on hand, 0 = sold out)."""

    sku: str
    options: dict[str, str]
    price: Decimal
    stock: int

    def label(self) -> str:
        """``"black, M"``: the option values joined (the sku when there are none)."""
        return ", ".join(str(v) for v in self.options.values()) or self.sku


@dataclass(frozen=True)
class ProductView:
    """A catalog product in one language, read fresh from the catalog: ``title``,
    ``description``, ``url`` and ``image`` ("" for none), ``tags``, ``attributes``
    (``{"material": "brass"}``), ``price`` in ``currency`` (ISO 4217; the lowest variant price
    is :meth:`price_range`'s), ``stock`` (a product without variants: units, None when not
    tracked) and ``variants`` in the catalog's order."""

    sku: str
    locale: str
    title: str
    description: str
    url: str
    image: str
    tags: tuple[str, ...]
    attributes: dict[str, object]
    price: Decimal
    currency: str
    stock: int | None
    variants: tuple[ProductVariantView, ...] = ()

    def price_range(self) -> tuple[Decimal, Decimal]:
        """``(lowest, highest)`` price over the variants (the product's price twice without)."""
        prices = [v.price for v in self.variants] or [self.price]
        return min(prices), max(prices)

    def in_stock(self) -> int | None:
        """Units on hand over all variants (or the product's own count; None: not tracked)."""
        if self.variants:
            return sum(max(v.stock, 0) for v in self.variants)
        return self.stock


@dataclass(frozen=True)
class ProductNames:
    """What names a product, for finding it in a shopper's words (the router's catalog index):
    ``sku``, ``titles`` (``{locale: title}``), ``tags`` (every language's), ``variant_skus``
    and ``options`` (``{variant sku: every language's option values}``); ``attribute_keys``: the
    attributes any language gives; ``updated``: when an
    import last changed it (ISO 8601), so a reader can tell which products changed."""

    sku: str
    titles: dict[str, str]
    tags: tuple[str, ...]
    variant_skus: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    updated: str = ""
    attribute_keys: tuple[str, ...] = ()
