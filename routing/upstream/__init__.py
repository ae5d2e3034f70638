"""Calling a paid model: which deployment, whether it may be called, what it cost.

``call`` holds the frozen ``Call`` (tier, deployment, request) and the ``Answered`` value a
stream gives back; ``tiers`` holds the tiers and their deployments; ``catalog`` each tier's
preference list of models and their prices; ``listing`` each endpoint's ``GET /models``, asked
before any call; ``canary`` a tier's candidate model; ``breaker``,
``throttle`` and ``blocks`` keep a failing, busy or blocked upstream from being called; ``budgets``
the spend budgets; ``resilience`` retries and falls back; ``singleflight`` shares identical calls;
``complete`` is the one helper for one-shot calls; ``ledger`` books every call's tokens and USD;
``tokens`` counts tokens offline.
"""
