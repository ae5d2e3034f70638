"""Store adapters: where a store keeps its orders (``demo``: kefu's own tables; ``shopify``)."""
