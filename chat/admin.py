from django.contrib import admin

from .models import CannedReply, Conversation, InternalNote, Label, Message, SearchLog


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("seq", "role", "agent_name", "text", "route", "model", "cost_usd", "ttft_ms", "cut")
    readonly_fields = fields
    can_delete = False


class InternalNoteInline(admin.TabularInline):
    model = InternalNote
    extra = 0
    fields = ("created_at", "author_name", "text")
    readonly_fields = fields
    can_delete = False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "agent_name", "locale", "last_seq", "waiting_since", "updated_at")
    list_filter = ("status", "locale")
    readonly_fields = (
        "id",
        "token_hash",
        "last_seq",
        "answered_seq",
        "owner_epoch",
        "agent",
        "agent_name",
        "waiting_since",
        "handoff_reason",
        "handoff_packet",
        "created_at",
        "updated_at",
    )
    inlines = [MessageInline, InternalNoteInline]


@admin.register(CannedReply)
class CannedReplyAdmin(admin.ModelAdmin):
    """Saved answers agents insert in the console (then edit before sending)."""

    list_display = ("title", "shortcut", "owner", "locale", "position", "active", "updated_at")
    list_editable = ("position", "active")
    list_filter = ("active", "locale")
    search_fields = ("title", "text", "shortcut")


@admin.register(Label)
class LabelAdmin(admin.ModelAdmin):
    """The store's conversation labels (chat.labels); also managed in the console."""

    list_display = ("name", "color", "position", "created_at")
    list_editable = ("color", "position")
    search_fields = ("name",)


@admin.register(SearchLog)
class SearchLogAdmin(admin.ModelAdmin):
    """Staff searches (chat.search): read-only, the record of who looked for what."""

    list_display = ("created_at", "agent", "query", "results", "took_ms")
    list_filter = ("agent",)
    date_hierarchy = "created_at"

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
