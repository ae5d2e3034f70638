"""The store part's tables: the demo store's orders, the audit log of every store call, and the
changes waiting for a shopper's confirmation.

``DemoOrder`` is where the demo adapter (``store.adapters.demo``) keeps its orders; a real store's
orders stay in its own system. ``StoreCall`` and ``PendingAction`` serve every adapter.
"""

from __future__ import annotations

from django.db import models


class DemoOrder(models.Model):
    """An order of the demo store. ``lines``: ``[{"sku", "title", "quantity", "unit_price"}]``
    (prices as decimal strings); ``shipping_address``: ``{"name", "line1", "line2", "city",
    "postcode", "country"}``; ``refunds``: ``[{"amount", "status", "created_at",
    "processed_at"}]``; ``returns``: ``[{"return_id", "status", "created_at"}]`` (ISO 8601 times)."""

    number = models.CharField(max_length=32, unique=True)
    customer_id = models.CharField(max_length=255, blank=True, db_index=True)
    email = models.EmailField()
    status = models.CharField(max_length=16)
    placed_at = models.DateTimeField()
    total = models.DecimalField(max_digits=12, decimal_places=2)
    currency = models.CharField(max_length=3, default="EUR")
    lines = models.JSONField(default=list)
    shipping_address = models.JSONField(default=dict)
    carrier = models.CharField(max_length=64, blank=True)
    tracking_number = models.CharField(max_length=64, blank=True)
    tracking_url = models.URLField(blank=True)
    shipped_at = models.DateTimeField(null=True, blank=True)
    estimated_delivery = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    refunds = models.JSONField(default=list, blank=True)
    returns = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-placed_at"]

    def __str__(self) -> str:
        return self.number


class StoreCall(models.Model):
    """The audit log: one row per store call made for a shopper, by the bot or by an agent.

    ``actor``: ``bot`` or ``agent``; ``actor_name``: the agent's username ("" for the bot);
    ``purpose``: how the call came about (``action``: the cheap path, no model call; ``tool``: a
    remote model called a tool; ``console``: an agent; ``confirm``: a shopper confirmed a
    change); ``action``: one of ``store.types.ACTIONS`` or ``orders`` (a list); ``outcome``:
    ``ok`` or a ``StoreError`` code; ``idempotency_key``: set for changes, unique, so one key
    changes an order once; ``latency_ms``: the adapter's time. No personal data is kept here:
    the order number and the outcome only."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    adapter = models.CharField(max_length=32)
    actor = models.CharField(max_length=8)
    actor_name = models.CharField(max_length=150, blank=True)
    purpose = models.CharField(max_length=16)
    action = models.CharField(max_length=16)
    order_number = models.CharField(max_length=32, blank=True)
    conversation_id = models.UUIDField(null=True, blank=True, db_index=True)
    message_id = models.BigIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16)
    detail = models.CharField(max_length=200, blank=True)
    idempotency_key = models.CharField(max_length=64, null=True, blank=True, unique=True)
    latency_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.actor}:{self.action} {self.order_number} -> {self.outcome}"


class PendingAction(models.Model):
    """A change the bot offered and the shopper has not confirmed yet (one per conversation: a
    newer offer replaces it). ``arguments``: the change's inputs (``{"address": {...}}`` for an
    address change); ``expires_at``: after it, a "yes" no longer confirms it; ``owner_email``:
    the e-mail an anonymous shopper proved the order with ("" for a verified shopper)."""

    conversation_id = models.UUIDField(unique=True)
    action = models.CharField(max_length=16)
    order_number = models.CharField(max_length=32)
    customer_id = models.CharField(max_length=255, blank=True)
    owner_email = models.CharField(max_length=254, blank=True)
    arguments = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.action} {self.order_number}"


class KnownOrder(models.Model):
    """An order a shopper proved in a conversation (an anonymous shopper's order number with the
    e-mail on it, or a verified shopper's order the bot looked up), so that "can I cancel it?"
    later in the same conversation, and the agent's console, know which order is meant.
    ``email``: the e-mail the anonymous shopper proved it with ("" for a verified shopper)."""

    conversation_id = models.UUIDField(db_index=True)
    order_number = models.CharField(max_length=32)
    customer_id = models.CharField(max_length=255, blank=True)
    email = models.CharField(max_length=254, blank=True)
    seen_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["conversation_id", "order_number"], name="known_order_once")]
        ordering = ["-seen_at"]

    def __str__(self) -> str:
        return self.order_number


class Product(models.Model):
    """A catalog product's shared part (``store.catalog``): what every language of a ``sku``
    shares. ``price``: in ``currency`` (ISO 4217), the price of a variant with none of its own;
    ``stock``: units on hand for a product without variants (None: not tracked); ``updated_at``:
    touched by every import that changed the product, its texts or its variants (the router's
    catalog index polls it); ``shopify_id``: the product's Shopify gid
    (``"gid://shopify/Product/108828309"``) when ``sync_products`` or a webhook wrote it, else ""."""

    sku = models.CharField(max_length=64, unique=True)
    shopify_id = models.CharField(max_length=64, blank=True, db_index=True)
    price = models.DecimalField(max_digits=12, decimal_places=2)
    currency = models.CharField(max_length=3)
    stock = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["sku"]

    def __str__(self) -> str:
        return self.sku


class ProductText(models.Model):
    """A product in one language: ``title``, ``description``, ``url``, ``image``, ``tags``
    (``["lamp", ...]``), ``attributes`` (``{"material": "brass", ...}``) and ``options``: each
    variant's options in this language (``{variant sku: {"colour": "black"}}``)."""

    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="texts")
    locale = models.CharField(max_length=16)
    title = models.CharField(max_length=300)
    description = models.TextField(blank=True)
    url = models.URLField(max_length=500, blank=True)
    image = models.URLField(max_length=500, blank=True)
    tags = models.JSONField(default=list, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    options = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["product", "locale"], name="product_text_once")]
        ordering = ["product_id", "locale"]

    def __str__(self) -> str:
        return f"{self.title} ({self.locale})"


class ProductVariant(models.Model):
    """One variant of a product, shared by its languages: ``sku`` (unique), ``options``
    (``{"size": "M", "colour": "black"}``, as the last import gave them), ``price`` (None: the
    product's), ``stock`` (units on hand), ``position`` (the file's order)."""

    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="variants")
    sku = models.CharField(max_length=64, unique=True)
    options = models.JSONField(default=dict, blank=True)
    price = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    stock = models.IntegerField(default=0)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["product_id", "position", "id"]

    def __str__(self) -> str:
        return self.sku


class ShopifyWebhook(models.Model):
    """A Shopify webhook delivery kefu applied, by its ``X-Shopify-Webhook-Id`` (unique: a replayed
    or retried delivery finds its id here and is ignored, in every process and after a restart).
    Rows older than ``KEFU_SHOPIFY_WEBHOOK_KEEP_S`` are deleted as new deliveries arrive."""

    webhook_id = models.CharField(max_length=64, unique=True)
    topic = models.CharField(max_length=64)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.topic} {self.webhook_id}"
