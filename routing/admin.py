from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import FaqEntry
from .services import faq_changed


@admin.register(FaqEntry)
class FaqEntryAdmin(admin.ModelAdmin):
    list_display = ("intent", "locale", "question", "active", "updated_at")
    list_filter = ("locale", "active")
    search_fields = ("intent", "question", "answer")

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        faq_changed()

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        super().delete_model(request, obj)
        faq_changed()
