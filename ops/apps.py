from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The ops app: it reads chat, the router and the cache, and writes only its own derived tables
    (hourly rollups, queue samples)."""

    name = "ops"
