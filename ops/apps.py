from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The ops app: it reads chat, the router and the cache, and writes only its own derived tables
    (hourly rollups, queue samples). Its deployment checks are in ``ops.checks``."""

    name = "ops"

    def ready(self) -> None:
        from ops import checks  # noqa: F401 - registers the checks
