"""Fixtures shared by the chat tests: ``make_agent`` (an agent console socket, defined with the
console tests) for the tests of other files that need an agent online."""

from test_console import make_agent  # noqa: F401  (a fixture)
