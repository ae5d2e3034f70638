"""Settings come from the environment and a bad value stops start-up with a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env={**full, "KEFU_NO_WARMUP": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bad_number_names_the_variable_and_its_value():
    result = check(KEFU_FAQ_MIN_CONFIDENCE="high")
    assert result.returncode != 0
    assert "KEFU_FAQ_MIN_CONFIDENCE='high' is not a valid float" in result.stderr


def test_a_database_url_without_a_scheme_names_the_variable():
    result = check(DATABASE_URL="db.sqlite3")
    assert result.returncode != 0
    assert "DATABASE_URL='db.sqlite3' is not a database URL" in result.stderr
    assert "KeyError" not in result.stderr


def test_embedded_defaults_need_no_environment():
    result = check()
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


PRODUCTION = {
    "SECRET_KEY": "x9Kq2LmZ7vTt4Wb0Rj8Nc5Hs1Yd6Fg3Pe-Ua_Vo2Ii7Xk4Ql9Mw0Zr5Sn8Bh3Cf",
    "ALLOWED_HOSTS": "chat.shop.example",
    "CSRF_TRUSTED_ORIGINS": "https://chat.shop.example",
    "KEFU_BEHIND_TLS": "true",
    "KEFU_PROXY_MAX_BODY_BYTES": "3145728",  # nginx client_max_body_size 3m (docs/security.md)
}


def test_the_development_key_is_refused_for_a_host_others_can_reach():
    result = check(ALLOWED_HOSTS="chat.shop.example")
    assert result.returncode != 0
    assert "SECRET_KEY is unset (the development key) but ALLOWED_HOSTS='chat.shop.example'" in result.stderr


def test_production_settings_pass_the_deploy_check_with_no_warning():
    result = check("--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "identified no issues" in result.stdout


def test_without_tls_the_deploy_check_names_what_is_missing():
    plain = {k: v for k, v in PRODUCTION.items() if k != "KEFU_BEHIND_TLS"}
    result = check("--deploy", "--fail-level", "WARNING", **plain)
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):  # HSTS, redirect, cookies
        assert warning in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("declared", "warning"),
    [
        ("", "kefu.W001"),  # the proxy's body limit not declared
        ("104857600", "kefu.W002"),  # 100 MB: the proxy buffers such bodies whole
        ("1048576", "kefu.W003"),  # nginx's default 1m: below Django's 2.5 MiB, kefu's JSON 413 never seen
    ],
)
def test_the_deploy_check_names_an_unsound_proxy_body_limit(declared: str, warning: str) -> None:
    env = {k: v for k, v in PRODUCTION.items() if k != "KEFU_PROXY_MAX_BODY_BYTES"}
    if declared:
        env["KEFU_PROXY_MAX_BODY_BYTES"] = declared
    result = check("--deploy", "--fail-level", "WARNING", **env)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert warning in output
    assert [w for w in ("kefu.W001", "kefu.W002", "kefu.W003") if w in output] == [warning]


def test_a_short_identity_secret_is_refused():
    result = check(KEFU_IDENTITY_SECRET="too-short")
    assert result.returncode != 0
    assert "KEFU_IDENTITY_SECRET is shorter than 32 characters" in result.stderr


def test_an_answer_lease_too_short_to_renew_is_refused():
    """(Replaces the orphan threshold: answers now hold a renewed lease, so the longest an answer
    may stream no longer bounds the setting.)"""
    result = check(KEFU_ANSWER_LEASE_S="1")
    assert result.returncode != 0
    assert "KEFU_ANSWER_LEASE_S=1 is too short" in result.stderr
    assert check(KEFU_ANSWER_LEASE_S="3").returncode == 0


def native_pools(**env: str) -> subprocess.CompletedProcess[str]:
    """Import kefu's config the way every entry point does, then numpy and faiss, and report the
    thread pools of the native libraries they loaded (threadpoolctl)."""
    full = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    }
    code = (
        "import config, numpy, faiss, threadpoolctl; numpy.ones((64, 64)) @ numpy.ones((64, 64)); "
        "print(sorted({p['num_threads'] for p in threadpoolctl.threadpool_info()}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**full, **env}, capture_output=True, text=True, timeout=120
    )


def test_native_math_libraries_get_one_thread_unless_told_otherwise():
    """Their spinning pools took the cores from a second worker (lib/native_threads.py)."""
    one = native_pools()
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == "[1]"
    two = native_pools(KEFU_NATIVE_THREADS="2")
    assert two.returncode == 0, two.stderr
    assert two.stdout.strip() == "[2]"
    operator = native_pools(OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")  # the operator's own choice stands
    assert operator.returncode == 0, operator.stderr
    assert operator.stdout.strip() == "[2]"
    bad = native_pools(KEFU_NATIVE_THREADS="many")
    assert bad.returncode != 0 and "KEFU_NATIVE_THREADS='many' must be a positive integer" in bad.stderr


def test_a_canary_share_outside_0_to_1_is_refused():
    result = check(KEFU_SIMPLE_CANARY_SHARE="10")
    assert result.returncode != 0
    assert "KEFU_SIMPLE_CANARY_SHARE=10.0 must be from 0 to 1" in result.stderr


def test_a_bad_tier_setting_stops_the_start_and_names_the_variable_and_its_value():
    """The tiers are typed and validated once at start (routing/upstream/config.py)."""
    for variable, value, message in [
        ("KEFU_MEDIUM_PRICE_OUTPUT", "-1", "KEFU_MEDIUM_PRICE_OUTPUT=-1.0 must be 0 or more (USD per million tokens)"),
        ("KEFU_SIMPLE_CANARY_SHARE", "2", "KEFU_SIMPLE_CANARY_SHARE=2.0 must be from 0 to 1"),
        ("KEFU_COMPLEX_BASE_URL", "api.example.com/v1", "KEFU_COMPLEX_BASE_URL='api.example.com/v1' must be an http"),
        ("KEFU_LLM_TOTAL_TIMEOUT_S", "0", "KEFU_LLM_TOTAL_TIMEOUT_S=0.0 must be a positive number of seconds"),
        ("KEFU_SIMPLE_FIRST_TOKEN_TIMEOUT_S", "-5", "KEFU_SIMPLE_FIRST_TOKEN_TIMEOUT_S=-5.0 must be 0"),
        ("KEFU_MEDIUM_RPM", "-1", "KEFU_MEDIUM_RPM=-1 must be 0 (no limit of ours) or more"),
    ]:
        result = check(**{variable: value})
        assert result.returncode != 0, variable
        assert "ImproperlyConfigured" in result.stderr and message in result.stderr, result.stderr[-600:]


def test_the_tiers_are_typed_with_their_defaults():
    """``KEFU_TIERS`` maps each tier to a frozen TierConfig (the values the dicts held before)."""
    import dataclasses

    from django.conf import settings

    from routing.upstream.config import TierConfig

    assert list(settings.KEFU_TIERS) == ["simple", "medium", "complex"]
    complex_ = settings.KEFU_TIERS["complex"]
    assert isinstance(complex_, TierConfig) and dataclasses.is_dataclass(complex_)
    assert (complex_.current.price_input_per_mtok, complex_.current.price_output_per_mtok) == (2.00, 8.00)
    assert complex_.candidate == complex_.current  # no canary: the candidate is the tier's own deployment
    with pytest.raises(dataclasses.FrozenInstanceError):
        complex_.rpm = 5  # type: ignore[misc]


def test_a_json_setting_that_is_not_an_object_or_a_prompt_budget_below_one_is_refused():
    result = check(KEFU_STORE_PLACEHOLDERS='["Support Email"]')
    assert result.returncode != 0
    assert "KEFU_STORE_PLACEHOLDERS='[\"Support Email\"]' must be a JSON object" in result.stderr
    result = check(KEFU_MEDIUM_CONTEXT_TOKENS="0")
    assert result.returncode != 0
    assert "KEFU_MEDIUM_CONTEXT_TOKENS=0 must be a positive number of tokens" in result.stderr


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("smtp://user:secret@mail.example:notaport", "EMAIL_URL='smtp://user:***@mail.example:notaport'"),
        ("mail.example:587", "EMAIL_URL='mail.example:587' is not an e-mail URL"),
        ("filemail://relative/dir", "filemail needs an absolute directory"),
    ],
)
def test_a_malformed_email_url_stops_the_start_and_names_the_variable(url, says):
    result = check(EMAIL_URL=url)
    assert result.returncode != 0
    assert says in result.stderr and "secret" not in result.stderr


def test_bad_opening_hours_stop_the_start_and_name_the_key():
    result = check(KEFU_BUSINESS_HOURS='{"tz": "Europe/Berlin", "mon": ["17:00-09:00"]}')
    assert result.returncode != 0
    assert "KEFU_BUSINESS_HOURS: mon: '17:00-09:00' ends before it starts" in result.stderr
