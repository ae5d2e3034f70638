from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The read-only ops app (no models of its own)."""

    name = "ops"
