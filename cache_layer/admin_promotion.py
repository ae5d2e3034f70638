"""Admin: the verified promotions (``cache_layer.promotion``): every near miss judged, its
verdict, and an action to revert a promotion (its alias evicted, the entry's verified cosine
recomputed). Rows are written by the judge only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from . import promotion
from .models import CacheJudgement


@admin.register(CacheJudgement)
class CacheJudgementAdmin(admin.ModelAdmin):
    list_display = ("question", "cached_question", "similarity", "verdict", "reverted", "judge_model", "created_at")
    list_filter = ("verdict", "judge_model", "scope")
    search_fields = ("question", "cached_question", "cached_answer")
    date_hierarchy = "created_at"
    actions = ["revert_selected"]
    readonly_fields = [f.name for f in CacheJudgement._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # shown read-only; reverting is the action below

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # a judgement is a record; revert undoes its effect
        return actions

    @admin.display(boolean=True, description="reverted")
    def reverted(self, obj: CacheJudgement) -> bool:
        return obj.reverted_at is not None

    @admin.action(description="Revert the selected promotions (evict their aliases)", permissions=["delete"])
    def revert_selected(self, request: HttpRequest, queryset: QuerySet[CacheJudgement]) -> None:
        by = request.user.get_username() if request.user.is_authenticated else "admin"
        n = sum(promotion.judgement_revert(judgement_id=pk, by=by) for pk in queryset.values_list("id", flat=True))
        self.message_user(request, f"Reverted {n} promotion(s).", messages.SUCCESS)
