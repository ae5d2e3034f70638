"""The OpenAI-compatible gateway: the router behind ``POST /v1/chat/completions``.

``completions`` answers a request through the router's decision; ``views`` speaks OpenAI's wire
format over HTTP (wired by Config).
"""
