"""The router's halves of reviewing the answer cache (``cache_layer`` holds the rest).

``audit`` re-answers a sampled semantic hit to measure wrong hits; ``promotion`` has the ``simple``
tier judge whether a near miss needs the same answer as the question it missed.
"""
