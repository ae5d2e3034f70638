"""Admin: list, search, inspect and purge cached answers.

Every deletion goes through :mod:`cache_layer.services` (the "purge selected" action and the
Delete button of an entry), so the exact store (Redis or local memory) and the semantic indexes
forget the entry too; Django's own bulk "delete selected", which would leave the exact store's
keys behind, is removed.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from . import services
from .models import CachedAnswer


class StateFilter(admin.SimpleListFilter):
    """Live (not yet expired) or expired entries."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "live"), ("expired", "expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[CachedAnswer]) -> QuerySet[CachedAnswer]:
        now = timezone.now()
        if self.value() == "live":
            return queryset.filter(expires_at__gt=now)
        if self.value() == "expired":
            return queryset.filter(expires_at__lte=now)
        return queryset


@admin.register(CachedAnswer)
class CachedAnswerAdmin(admin.ModelAdmin):
    list_display = ("question", "scope", "route", "model", "locale", "hits", "live", "created_at", "expires_at")
    list_filter = (StateFilter, "route", "locale", "model", "scope")
    search_fields = ("question", "answer", "key_text")
    date_hierarchy = "created_at"
    actions = ["purge_selected"]
    # Entries are written only by cache_layer.services.store; the admin inspects and deletes.
    readonly_fields = [f.name for f in CachedAnswer._meta.fields if f.name != "embedding"]
    exclude = ("embedding",)

    def has_add_permission(self, request: object) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # bypasses the exact store; "purge selected" replaces it
        return actions

    @admin.display(boolean=True, description="live")
    def live(self, obj: CachedAnswer) -> bool:
        return obj.expires_at > timezone.now()

    @admin.action(description="Purge selected cached answers (database and exact store)", permissions=["delete"])
    def purge_selected(self, request: HttpRequest, queryset: QuerySet[CachedAnswer]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        n = sum(1 for entry_id in ids if services.evict_entry(entry_id))
        self.message_user(request, f"Purged {n} cached answer(s).", messages.SUCCESS)

    def delete_model(self, request: HttpRequest, obj: CachedAnswer) -> None:
        services.evict_entry(obj.id)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[CachedAnswer]) -> None:
        for entry_id in list(queryset.values_list("id", flat=True)):
            services.evict_entry(entry_id)


# The other admins of the cache: audits (the measured false-hit rate) and verified promotions.
from . import admin_audit, admin_promotion  # noqa: E402,F401
