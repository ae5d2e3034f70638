"""What leaves for a model: the prompt and what shapes it.

``build`` assembles the grounded prompt within the tier's context window; ``privacy`` masks personal
data with reversible placeholders; ``rewrite`` turns a follow-up into a standalone question;
``summary`` is the rolling summary's model half.
"""
