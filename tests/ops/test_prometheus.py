"""What each process records for Prometheus (lib.metrics) and how /metrics shows it: time to
first token and latency histograms per route and tier from real answers, open sockets, the sum
over several worker processes (multiprocess mode), and the Grafana dashboard's metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "kefu-dashboard.json"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of a Prometheus text exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_faq_answer_is_in_the_histograms_and_an_open_socket_in_the_gauge(make_client, faq, client):
    from asgiref.sync import sync_to_async

    get = sync_to_async(lambda: client.get("/metrics").content.decode())
    before = await get()
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("How long does delivery take?")
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "faq"
    after = await get()
    ttft = "kefu_time_to_first_token_seconds_count"
    assert value(after, ttft, route="faq", tier="none") == value(before, ttft, route="faq", tier="none") + 1
    latency = "kefu_answer_latency_seconds_count"
    assert value(after, latency, route="faq", tier="none") == value(before, latency, route="faq", tier="none") + 1
    # The observed time is the answer's own ttft_ms, in seconds, in a bucket at or above it.
    observed = end["usage"]["ttft_ms"] / 1000
    grew = [
        float(dict(labels)["le"])
        for (name, labels), v in samples(after).items()
        if name == "kefu_time_to_first_token_seconds_bucket"
        and dict(labels)["route"] == "faq"
        and v > samples(before).get((name, labels), 0.0)
    ]
    assert grew and min(grew) >= observed
    sockets = value(after, "kefu_open_sockets", kind="shopper")
    assert sockets >= 1
    await shopper.close()
    assert value(await get(), "kefu_open_sockets", kind="shopper") == sockets - 1


def test_tiers_are_labelled_from_the_route() -> None:
    from lib.metrics import tier_of

    assert tier_of("llm.complex") == "complex"
    assert tier_of("cache.semantic") == "none"
    assert tier_of("faq") == "none"


WORKER = """
import sys
from lib import metrics
for _ in range(int(sys.argv[1])):
    metrics.observe_answer(route="llm.simple", ttft_ms=420.0, latency_ms=1800.0)
metrics.OPEN_SOCKETS.labels("shopper").inc(int(sys.argv[2]))
if sys.argv[3] == "ended":
    metrics.process_ended()
"""


@pytest.mark.django_db
def test_several_worker_processes_are_summed(tmp_path: Path, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Three real processes write their values to the multiprocess directory; /metrics in this
    # one sums them. The third ended gracefully: its sockets no longer count.
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for runs, sockets, state in ((3, 2, "live"), (5, 4, "live"), (1, 7, "ended")):
        subprocess.run([sys.executable, "-c", WORKER, str(runs), str(sockets), state], env=env, cwd=ROOT, check=True)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    text = client.get("/metrics").content.decode()
    assert value(text, "kefu_time_to_first_token_seconds_count", route="llm.simple", tier="simple") == 9
    assert value(text, "kefu_time_to_first_token_seconds_sum", route="llm.simple", tier="simple") == pytest.approx(
        9 * 0.42
    )
    assert value(text, "kefu_time_to_first_token_seconds_bucket", route="llm.simple", tier="simple", le="0.25") == 0
    assert value(text, "kefu_time_to_first_token_seconds_bucket", route="llm.simple", tier="simple", le="0.5") == 9
    assert value(text, "kefu_answer_latency_seconds_count", route="llm.simple", tier="simple") == 9
    # The process that ended gracefully removed its 7 sockets; the two that exited without saying
    # so still count (as a worker killed with SIGKILL does, until the directory is emptied).
    assert value(text, "kefu_open_sockets", kind="shopper") == 6
    assert "# TYPE kefu_answers_total counter" in text  # the database's totals come first, as before


@pytest.mark.django_db
def test_every_metric_the_grafana_dashboard_names_is_served(client: Any) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 8
    named = {re.sub(r"_(bucket|sum|count|total)$", "", m) for e in exprs for m in re.findall(r"\bkefu_[a-z_]+", e)}
    assert {"kefu_time_to_first_token_seconds", "kefu_answer_latency_seconds", "kefu_open_sockets"} <= named
    text = client.get("/metrics").content.decode()
    served = {family.name for family in text_string_to_metric_families(text)}
    assert named <= served, named - served


@pytest.mark.django_db
def test_the_agent_queue_length_and_its_longest_wait_are_gauges(client: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from chat.models import Conversation

    text = client.get("/metrics").content.decode()
    assert value(text, "kefu_agent_queue_oldest_wait_seconds") == 0.0  # no one waits
    now = timezone.now()
    for waited_s in (30, 90):
        Conversation.objects.create(
            token_hash="x" * 64, status="waiting_agent", waiting_since=now - timedelta(seconds=waited_s)
        )
    Conversation.objects.create(token_hash="x" * 64, status="agent")
    text = client.get("/metrics").content.decode()
    assert value(text, "kefu_conversations", status="waiting_agent") == 2
    assert value(text, "kefu_conversations", status="agent") == 1
    assert 90 <= value(text, "kefu_agent_queue_oldest_wait_seconds") < 90 + 60
