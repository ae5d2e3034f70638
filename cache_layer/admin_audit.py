"""Admin: the cache audits (``CacheAudit``), read-only, with the false-hit rate per intent.

Rows are written only by :mod:`cache_layer.audit` (sampled re-answers and agents' marks); the
admin lists and inspects them. The changelist shows :func:`cache_layer.audit.false_hit_rates`
above the rows (template ``admin/cache_layer/cacheaudit/change_list.html``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse

from .audit import false_hit_rates, same_cosine
from .models import CacheAudit


@admin.register(CacheAudit)
class CacheAuditAdmin(admin.ModelAdmin):
    list_display = ("created_at", "verdict", "intent", "similarity", "question", "cached_question", "tier", "marked_by")
    list_filter = ("verdict", "intent", "tier")
    search_fields = ("question", "cached_question", "cached_answer", "fresh_answer")
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in CacheAudit._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        """The changelist with ``false_hit_rates`` (list of ``IntentRate``) and ``same_cosine`` in its context."""
        context = {**(extra_context or {}), "false_hit_rates": false_hit_rates(), "same_cosine": same_cosine()}
        return super().changelist_view(request, extra_context=context)  # type: ignore[return-value]
