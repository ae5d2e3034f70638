from django.contrib import admin

from .models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("seq", "role", "text", "route", "model", "cost_usd", "ttft_ms", "cut")
    readonly_fields = fields
    can_delete = False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "locale", "last_seq", "updated_at")
    list_filter = ("status", "locale")
    readonly_fields = ("id", "token_hash", "last_seq", "answered_seq", "owner_epoch", "created_at", "updated_at")
    inlines = [MessageInline]
