"""One page of settings (issue 27, item 5): every environment variable the code reads is recorded
by ``lib.settings_env.env`` and documented in docs/configuration.md and .env.example."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lib.settings_env import RecordingEnv

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("SIMPLE", "MEDIUM", "COMPLEX")

# Import the settings and every entry point the way a server does, then call the one read that
# happens later (the metrics directory), and print what the helper recorded.
_NAMES_READ = (
    "import json, django; django.setup(); import config.asgi, lib.metrics; lib.metrics.multiprocess_dir(); "
    "from lib.settings_env import names_read; print(json.dumps(sorted(names_read())))"
)


def names_read(**env: str) -> set[str]:
    """The names a fresh process reads with ``env`` (over a clean environment: no kefu variable)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KEFU_", "DJANGO_", "OPENAI_"))}
    clean = {k: v for k, v in clean.items() if k not in ("REDIS_URL", "DATABASE_URL", "SECRET_KEY", "ALLOWED_HOSTS")}
    result = subprocess.run(
        [sys.executable, "-c", _NAMES_READ],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", "KEFU_NO_WARMUP": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return set(names)


def documented() -> set[str]:
    """The names in docs/configuration.md's backticks, ``<TIER>`` spelled out for each tier."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    out: set[str] = set()
    for name in re.findall(r"`([A-Z][A-Z0-9_<>]*)`", text):
        out |= {name.replace("<TIER>", tier) for tier in TIERS}
    return out


def in_env_example() -> set[str]:
    """The names .env.example assigns (``NAME=`` or ``# NAME=`` at the start of a line)."""
    text = (ROOT / ".env.example").read_text()
    return set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", text, re.MULTILINE))


def test_every_variable_the_code_reads_is_documented_and_in_env_example():
    # KEFU_BEHIND_TLS turns on the reads of the HSTS settings, which are read only with it.
    read = names_read() | names_read(KEFU_BEHIND_TLS="true")
    assert len(read) > 150, sorted(read)  # the whole settings module ran
    assert {"KEFU_MEDIUM_CANARY_SHARE", "KEFU_NATIVE_THREADS", "KEFU_HSTS_SECONDS", "KEFU_NO_WARMUP"} <= read
    missing_doc = sorted(read - documented())
    missing_example = sorted(read - in_env_example())
    assert not missing_doc, f"read by the code but not in docs/configuration.md: {missing_doc}"
    assert not missing_example, f"read by the code but not in .env.example: {missing_example}"


def test_the_recorder_records_names_built_at_run_time_and_names_a_bad_value(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    recorder = RecordingEnv()
    monkeypatch.setenv("KEFU_TEST_ONLY_PRICE", "cheap")
    for tier in ("simple", "medium"):
        assert recorder.float(f"KEFU_TEST_ONLY_{tier.upper()}_SHARE", default=0.5) == 0.5
    assert recorder.raw("KEFU_TEST_ONLY_RAW", "x") == "x"
    with pytest.raises(ImproperlyConfigured, match="KEFU_TEST_ONLY_PRICE='cheap' is not a valid float"):
        recorder.float("KEFU_TEST_ONLY_PRICE", default=1.0)
    assert recorder.names_read() == {
        "KEFU_TEST_ONLY_SIMPLE_SHARE",
        "KEFU_TEST_ONLY_MEDIUM_SHARE",
        "KEFU_TEST_ONLY_RAW",
        "KEFU_TEST_ONLY_PRICE",
    }


# Reads of the environment that bypass the recorder (writes such as setdefault are fine).
_DIRECT_READ = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)|environ\.Env\(")


def test_nothing_reads_the_environment_but_the_helper():
    offenders = []
    for part in ("chat", "routing", "cache_layer", "ops", "lib", "config", "store"):
        for path in sorted((ROOT / part).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            # the helper itself; the test settings set the environment aside for the in-process app
            if relative in ("lib/settings_env.py", "config/settings_test.py"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if _DIRECT_READ.search(line):
                    offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "read the environment through lib.settings_env.env:\n" + "\n".join(offenders)
