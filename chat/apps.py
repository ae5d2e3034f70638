from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _search_index(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """After every ``migrate`` (and test-database flush): staff search's index exists, whatever
    Django's table rebuilds dropped (chat.search.index_ensure)."""
    from django.db import connections

    from .search import index_ensure

    index_ensure(connections[using])


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Conversations"

    def ready(self) -> None:
        post_migrate.connect(_search_index, sender=self, dispatch_uid="chat_search_index")
