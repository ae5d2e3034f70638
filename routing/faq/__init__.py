"""The store's FAQ as a local model, and its out-of-scope twin.

``model`` matches a message to an FAQ entry (embeddings, no network); ``scope`` says whether a store
could answer it at all; ``registry`` keeps one trained pair per process fresh; ``trainer`` retrains
them in a process of their own; ``importer`` parses and writes FAQ files (``import_faq``).
"""
