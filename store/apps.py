from django.apps import AppConfig


class StoreConfig(AppConfig):
    """Store actions: order lookups and changes through a store adapter (store/services.py)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "store"
    verbose_name = "Store actions"
