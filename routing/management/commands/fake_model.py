"""``manage.py fake_model [--port N] [--ttft-ms MS] [--token-ms MS] [--model NAME ...]``: a fake model.

Serves the project's OpenAI-compatible test upstream (``routing/management/fake_upstream.py``) until
Ctrl-C, so that a machine without an API key sees remote answers stream: it answers every question
with ``Echo: <the last message>``, word by word, with a usage chunk when asked for one (as kefu
does). Once it listens it prints the variables that point kefu at it.
"""

from __future__ import annotations

import errno
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.management.fake_upstream import MODELS, Behaviour, FakeOpenAI

# The port it tries first (beside `make run`'s 8000); when it is taken, any free port.
DEFAULT_PORT = 8001


class Command(BaseCommand):
    # It serves no model of kefu's and touches no database: no system checks to wait for.
    requires_system_checks: list[str] = []
    help = (
        "Serve an OpenAI-compatible streaming test model (no key, no network) until Ctrl-C, and print "
        "the OPENAI_BASE_URL / OPENAI_API_KEY / KEFU_SIMPLE_MODEL that point kefu at it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument(
            "--port",
            type=int,
            default=None,
            help=f"port to listen on; 0 picks a free one (default {DEFAULT_PORT}, or a free one when it is taken)",
        )
        parser.add_argument(
            "--ttft-ms", type=float, default=300.0, help="delay before the first token, ms (default 300)"
        )
        parser.add_argument("--token-ms", type=float, default=40.0, help="delay between two tokens, ms (default 40)")
        parser.add_argument(
            "--model",
            action="append",
            dest="models",
            metavar="NAME",
            help=f"a model name GET /v1/models lists; repeat for more (default: {', '.join(MODELS)})",
        )
        parser.add_argument("--text", default=None, help="answer every question with this text (default: an echo)")

    def handle(
        self,
        *args: Any,
        host: str,
        port: int | None,
        ttft_ms: float,
        token_ms: float,
        models: list[str] | None,
        text: str | None,
        **options: Any,
    ) -> None:
        if ttft_ms < 0 or token_ms < 0:
            raise CommandError("--ttft-ms and --token-ms must be 0 or more")
        names = tuple(models or MODELS)
        default = Behaviour(text=text, ttft_ms=ttft_ms, token_ms=token_ms)
        for attempt in [DEFAULT_PORT, 0] if port is None else [port]:
            server = FakeOpenAI(host=host, port=attempt, default=default, models=names)
            try:
                server.serve_forever(on_ready=self._announce)
                return
            except OSError as error:
                if port is None and attempt == DEFAULT_PORT and error.errno == errno.EADDRINUSE:
                    continue  # 8001 is taken: any free port will do
                raise CommandError(f"cannot listen on {host}:{attempt}: {error.strerror or error}") from error

    def _announce(self, server: FakeOpenAI) -> None:
        self.stdout.write(f"fake model listening on {server.base_url} (models: {', '.join(server.models)})")
        self.stdout.write("point kefu at it, e.g. in another shell:")
        self.stdout.write(
            f"  OPENAI_BASE_URL={server.base_url} OPENAI_API_KEY=fake KEFU_SIMPLE_MODEL={server.models[0]} make run"
        )
        self.stdout.write("Ctrl-C stops it.")
        self.stdout.flush()
