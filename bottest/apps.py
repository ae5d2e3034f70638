from django.apps import AppConfig


class BottestConfig(AppConfig):
    """The bot tests' app: only the ``bot_test`` command; no models."""

    name = "bottest"
    verbose_name = "Bot tests"
