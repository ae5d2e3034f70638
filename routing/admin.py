import json
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from routing.faq.importer import faq_entry_changed
from routing.faq.registry import faq_changed
from routing.gateway.completions import hash_key, new_key
from routing.models import ApiKey, BudgetCounter, ConversationTask, FaqEntry, TierOverride, UpstreamCall
from routing.upstream import budgets


@admin.register(FaqEntry)
class FaqEntryAdmin(admin.ModelAdmin):
    list_display = ("intent", "locale", "question", "active", "updated_at")
    list_filter = ("locale", "active")
    search_fields = ("intent", "question", "answer")

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        """The add form filled from the query string, as Django's admin does, with ``variants``
        read as the JSON list it is (ops' FAQ candidates draft entries so: /ops/faq-candidates/)."""
        initial = super().get_changeform_initial_data(request)
        raw = initial.get("variants")
        if isinstance(raw, str):
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            initial["variants"] = [str(v) for v in parsed] if isinstance(parsed, list) else []
        return initial

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change:
            faq_entry_changed(obj.pk)
        faq_changed()

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        entry_id = obj.pk
        super().delete_model(request, obj)
        faq_entry_changed(entry_id)
        faq_changed()

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        super().delete_queryset(request, queryset)
        for entry_id in ids:
            faq_entry_changed(entry_id)
        faq_changed()


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Gateway keys. Adding one makes the key and shows it once, in the confirmation message;
    only its SHA-256 is kept. Untick ``active`` to revoke a key."""

    list_display = (
        "name",
        "prefix",
        "active",
        "budget_day_usd",
        "budget_month_usd",
        "created_by",
        "created_at",
        "last_used_at",
    )
    list_filter = ("active",)
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix", "created_by", "created_at", "last_used_at")

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            raw = new_key()
            obj.prefix, obj.key_hash = raw[:12], hash_key(raw)
            obj.created_by = request.user if request.user.is_authenticated else None
        super().save_model(request, obj, form, change)
        budgets.forget_key_limits()  # this process applies new limits at once (others within 10 s)
        if not change:
            messages.warning(
                request,
                f"The new key for '{obj.name}' is {raw} — copy it now: it is not stored and will not be shown again.",
            )


@admin.register(BudgetCounter)
class BudgetCounterAdmin(admin.ModelAdmin):
    """Spend budgets, read-only (``routing.upstream.budgets``): what each payer spent and holds in a day or
    month. Customer ids and addresses appear as keyed hashes."""

    list_display = ("starts_on", "period", "kind", "key", "spent_usd", "reserved_usd", "limit_usd", "updated_at")
    list_filter = ("period", "kind", "starts_on")
    search_fields = ("key",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(UpstreamCall)
class UpstreamCallAdmin(admin.ModelAdmin):
    """The cost ledger, read-only: one row per attempt to call a remote tier."""

    list_display = (
        "created_at",
        "purpose",
        "tier",
        "variant",
        "model",
        "attempt",
        "outcome",
        "error_code",
        "http_status",
        "prompt_tokens",
        "cached_prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "estimated",
        "ttft_ms",
        "latency_ms",
        "conversation_id",
        "message_id",
        "api_key",
    )
    list_filter = ("purpose", "outcome", "tier", "variant", "estimated", "error_code")
    list_select_related = ("api_key",)
    date_hierarchy = "created_at"
    search_fields = ("model", "=conversation__id")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(TierOverride)
class TierOverrideAdmin(admin.ModelAdmin):
    """Canary decisions (``routing.upstream.canary``), the audit trail: who promoted, rolled back or resumed
    which tier's candidate, when and why (``auto``: the automatic rollback). Read-only: decisions
    are made on ``/ops/canary/``, and the newest row of a tier is the one in force."""

    list_display = ("created_at", "tier", "candidate_model", "state", "by", "reason")
    list_filter = ("tier", "state", "by")
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ConversationTask)
class ConversationTaskAdmin(admin.ModelAdmin):
    """Shoppers' tasks across messages (``routing.orders.tasks``): read-only here, with delete (what
    the console's Clear does, without forgetting the store's offer: clear from the console)."""

    list_display = ("conversation_id", "intent", "order_number", "awaiting", "source", "expires_at")
    list_filter = ("intent", "awaiting", "source")
    search_fields = ("conversation_id", "order_number")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
