from django.apps import AppConfig


class CacheLayerConfig(AppConfig):
    name = "cache_layer"
    verbose_name = "Answer cache"

    def ready(self) -> None:
        # A store's slot vocabulary (KEFU_CACHE_SLOTS_PATH) that cannot be read stops the start
        # with an error naming the file and the entry, not the first cache lookup.
        from .slots import vocabulary

        vocabulary()
