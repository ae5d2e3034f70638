"""The router's product room: finding catalog products in a shopper's words (``index``) and the
template answers about them (``answers``). The route itself is ``routing.decide.product_flow``."""
