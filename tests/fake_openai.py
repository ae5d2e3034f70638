"""The tests' OpenAI-compatible streaming upstream: `routing/management/fake_upstream.py`.

The server lives in the project because `manage.py fake_model` serves it too, and the app never
imports `tests/`. This module keeps the name every test and benchmark uses (`from fake_openai
import Behaviour`, `from tests.fake_openai import FakeOpenAI`) and the command line the benchmarks
start (`python tests/fake_openai.py --port 0 --ttft-ms 300 --token-ms 20`, which prints
`listening on http://127.0.0.1:PORT/v1` once ready). See the server module for the behaviours.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run as a script, or imported from bench/ with only tests/ on the path: the project root holds
# the server. Appended, so it never shadows what is already importable.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from routing.management.fake_upstream import (  # noqa: E402
    MODELS,
    Behaviour,
    FakeOpenAI,
    default_answer,
    running_fake_openai,
    split_text,
)

__all__ = ["MODELS", "Behaviour", "FakeOpenAI", "default_answer", "main", "running_fake_openai", "split_text"]


def main(argv: list[str] | None = None) -> int:
    """CLI: serve until Ctrl-C with a default behaviour built from the flags."""
    parser = argparse.ArgumentParser(description="OpenAI-compatible fake chat server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    parser.add_argument("--token-ms", type=float, default=0.0, help="delay between tokens")
    parser.add_argument("--text", default=None, help="fixed answer (default: echo)")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    args = parser.parse_args(argv)
    default = Behaviour(text=args.text, ttft_ms=args.ttft_ms, token_ms=args.token_ms)
    FakeOpenAI(host=args.host, port=args.port, default=default, api_key=args.api_key).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
