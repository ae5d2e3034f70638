from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .faq_import import faq_entry_changed
from .models import FaqEntry
from .services import faq_changed


@admin.register(FaqEntry)
class FaqEntryAdmin(admin.ModelAdmin):
    list_display = ("intent", "locale", "question", "active", "updated_at")
    list_filter = ("locale", "active")
    search_fields = ("intent", "question", "answer")

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
