"""Bot tests (issue 37, docs/bot-tests.md): scenario files a store runs before its shoppers do,
``manage.py bot_test PATH... [--repeat K] [--junit FILE]``.

Above chat: it drives a shopper's path through ``chat.sandbox`` (chat's door for a test
conversation) inside ``lib.sandbox``, reads orders through the store's door and asks the router's
door to judge a criterion. Nothing of kefu's imports it (``pyproject.toml``'s import contracts).
"""
