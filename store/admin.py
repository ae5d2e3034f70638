"""The store part in ``/admin/``: the audit log of every store call (read-only), the changes
waiting for a shopper's "yes" (read-only) and the demo store's orders (editable, for the demo)."""

from typing import Any, get_args

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from .models import DemoOrder, PendingAction, StoreCall
from .types import OrderStatus


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written by the store's door only: staff look, nobody adds, edits or deletes."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(StoreCall)
class StoreCallAdmin(ReadOnlyAdmin):
    """The audit log: one row per store call, read or change, by the bot or an agent (``actor``,
    ``actor_name``: the agent's username), with how it came about (``purpose``: ``action``,
    ``tool``, ``confirm``, ``console``) and its ``outcome``. No personal data is kept here."""

    list_display = (
        "created_at",
        "actor",
        "actor_name",
        "purpose",
        "action",
        "order_number",
        "outcome",
        "latency_ms",
    )
    list_filter = ("actor", "purpose", "action", "outcome")
    search_fields = ("order_number", "actor_name")
    date_hierarchy = "created_at"


@admin.register(PendingAction)
class PendingActionAdmin(ReadOnlyAdmin):
    """Changes the bot offered and the shopper has not confirmed yet (they expire)."""

    list_display = ("created_at", "action", "order_number", "conversation_id", "expires_at")
    list_filter = ("action",)
    search_fields = ("order_number",)


@admin.register(DemoOrder)
class DemoOrderAdmin(admin.ModelAdmin):
    """The demo store's orders (``manage.py load_demo_orders``): edit a status to show the bot
    and the console another case."""

    list_display = ("number", "customer_id", "email", "status", "placed_at", "total", "currency", "carrier")
    list_editable = ("status",)
    list_filter = ("status", "currency")
    search_fields = ("number", "customer_id", "email", "tracking_number")

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "status":  # one of the statuses the adapter knows, not free text
            return forms.ChoiceField(choices=[(s, s) for s in get_args(OrderStatus)], label="Status")
        return super().formfield_for_dbfield(db_field, request, **kwargs)
