"""The router: answers each shopper message the cheapest way that is still right.

Chat reaches it only through ``routing.services`` (the door) with the values of ``routing.types``.
Behind the door, the rooms, each owning one job (docs/architecture.md, "The router's rooms"); a room
imports only the rooms below it (the ``layers`` contract in pyproject.toml):

``decide``        who answers: the strategy and its frozen ``Decision``, text classification, the tier
                  classifier, requests for a person, small talk, prompt injection, the bot's own words
``cache_review``  the router's halves of the answer cache's audit and verified promotion
``gateway``       ``POST /v1/chat/completions`` for a store's other tools
``orders``        the store on the router's side: the ``action`` route, its replies, the model's tools
``prompt``        what leaves for a model: the prompt, masked personal data, rewrites, summaries
``faq``           the local FAQ model and its out-of-scope twin: model, scope, registry, trainer, importer
``upstream``      calling a paid model: tiers, canary, breaker, throttle, blocks, budgets,
                  resilience, single flight, one-shot calls, the ledger, token counts
``providers``     the SDK seam (the only importer of ``openai``)
"""
