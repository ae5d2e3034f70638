"""Admin: list, inspect and delete cached answers (purge a scope by selecting its rows)."""
from __future__ import annotations

from django.contrib import admin

from .models import CachedAnswer


@admin.register(CachedAnswer)
class CachedAnswerAdmin(admin.ModelAdmin):
    list_display = ("question", "scope", "route", "model", "locale", "hits", "created_at", "expires_at")
    list_filter = ("route", "locale", "model", "scope")
    search_fields = ("question", "answer", "key_text")
    date_hierarchy = "created_at"
    # Entries are written only by cache_layer.services.store; the admin inspects and deletes.
    readonly_fields = [f.name for f in CachedAnswer._meta.fields if f.name != "embedding"]
    exclude = ("embedding",)

    def has_add_permission(self, request: object) -> bool:  # type: ignore[override]
        return False
