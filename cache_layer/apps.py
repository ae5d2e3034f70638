from django.apps import AppConfig


class CacheLayerConfig(AppConfig):
    name = "cache_layer"
    verbose_name = "Answer cache"
