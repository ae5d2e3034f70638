"""Who answers a shopper message: the route, the tier and the request, decided once.

``decision`` holds the frozen ``Decision``; ``strategy`` chooses the route in the documented order
of checks (docs/routing.md); ``classify`` does
the text-only work off the event loop (FAQ match, scope, tier, grounding, cache lookup);
``tier_classifier`` picks the tier or a person; ``replies`` recognises requests for a person and
small talk; ``injection`` flags prompt injection; ``answers`` holds the bot's own fixed words.
"""
