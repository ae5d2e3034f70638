"""FAQ candidates: the questions most often handed to a person or sent to a remote model, grouped by
meaning, so that staff can turn each group into an FAQ entry (which then answers it free, in
~10 ms, on route ``faq``).

The questions: shopper messages of the window whose bot answer took route ``handoff`` or
``llm.*``, without those that only asked for a person or met a keyword rule (their stored route
reason says so), those with personal data (``cache_layer.policy.personal_data``: an order
number, an e-mail...), and those too short to be a question ("hi", "ok?"). At most ``MAX_QUESTIONS`` of the most
recent are grouped.

The groups: the questions' sentence embeddings (the same model the FAQ and the cache use: unit
vectors, so a dot product is a cosine) clustered with scikit-learn's agglomerative clustering,
average linkage on cosine distance, cut at ``1 - KEFU_FAQ_CANDIDATE_COSINE`` (0.88: every pair of
groups merged is on average at least that alike; with the bundled model unrelated store questions
sit at 0.78-0.84, paraphrases at 0.92-0.93). Each group is shown by its medoid (the question
most like the others), a few more of its questions, how often it went to a person and to a model,
and a model's answer to draft the entry from.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import numpy as np
from django.conf import settings
from django.utils import timezone
from django.utils.text import slugify

from cache_layer.embeddings import get_embedder
from cache_layer.policy import personal_data
from chat.models import Message, Role
from lib.text import detect_locale

__all__ = ["MAX_QUESTIONS", "faq_candidates"]

MAX_QUESTIONS = 2000  # the clustering holds an N x N distance matrix: 2,000 questions is 32 MB
_PERSON_REASONS = ("shopper asked for a person", "rule ", "budget:")


def _questions(since: datetime, until: datetime) -> list[dict[str, Any]]:
    answers = list(
        Message.objects.filter(
            role=Role.BOT,
            created_at__gte=since,
            created_at__lt=until,
            reply_to_seq__isnull=False,
            conversation__sandbox=False,
        )
        .filter(route__in=["handoff", "llm.simple", "llm.medium", "llm.complex"])
        .order_by("-created_at")
        .values("conversation_id", "reply_to_seq", "route", "route_reason", "text", "created_at")[: MAX_QUESTIONS * 2]
    )
    keep = [a for a in answers if not a["route_reason"].startswith(_PERSON_REASONS)]
    if not keep:
        return []
    wanted = {(a["conversation_id"], a["reply_to_seq"]) for a in keep}
    asked = {
        (m["conversation_id"], m["seq"]): m["text"]
        for m in Message.objects.filter(
            role=Role.SHOPPER,
            conversation_id__in={c for c, _ in wanted},
            seq__in={s for _, s in wanted},
        ).values("conversation_id", "seq", "text")
        if (m["conversation_id"], m["seq"]) in wanted
    }
    out = []
    for a in keep:
        text = (asked.get((a["conversation_id"], int(a["reply_to_seq"] or 0))) or "").strip()
        # Too short to be a question of its own ("hi", "ok?"), or holding personal data.
        if (len(re.findall(r"\w+", text)) < 3 and len(text) < 6) or personal_data(text):
            continue
        out.append({**a, "question": text})
        if len(out) >= MAX_QUESTIONS:
            break
    return out


def _medoid(vectors: np.ndarray) -> int:
    return int(np.argmax((vectors @ vectors.T).sum(axis=1)))


def faq_candidates(
    *, hours: float = 24 * 7, now: datetime | None = None, min_size: int = 2, limit: int = 20
) -> list[dict[str, Any]]:
    """The groups of alike questions the bot could not answer itself in the last ``hours``,
    largest first, at most ``limit``, each of at least ``min_size`` questions:

    ``{"size", "handoffs", "model_answers", "question" (the medoid), "examples" (up to 5 more),
    "locale", "last_seen" (ISO 8601), "draft_answer" (a model's answer to one of them, "" when
    none), "draft_url" (the admin's "add FAQ entry" form, filled)}``.

    Blocking: embeds the questions (~10 ms each the first time on 2 cores)."""
    now = now or timezone.now()
    rows = _questions(now - timedelta(hours=hours), now)
    if len(rows) < max(2, min_size):
        return []
    vectors = np.asarray(get_embedder().embed([r["question"] for r in rows]), dtype=np.float32)
    from sklearn.cluster import AgglomerativeClustering  # heavy import: only when the page is asked for

    labels = AgglomerativeClustering(
        n_clusters=None,
        metric="cosine",
        linkage="average",
        distance_threshold=1.0 - settings.KEFU_FAQ_CANDIDATE_COSINE,
    ).fit_predict(vectors)
    groups: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(int(label), []).append(index)
    out = []
    for members in sorted(groups.values(), key=len, reverse=True):
        if len(members) < min_size:
            break
        centre = members[_medoid(vectors[members])]
        question = rows[centre]["question"]
        routes = Counter("handoff" if rows[i]["route"] == "handoff" else "model" for i in members)
        modelled = [i for i in members if rows[i]["route"].startswith("llm.") and rows[i]["text"]]
        draft = rows[centre]["text"] if centre in modelled else (rows[modelled[0]]["text"] if modelled else "")
        examples = list(dict.fromkeys(rows[i]["question"] for i in members if i != centre))[:5]
        locale = detect_locale(question, "en")
        form = {
            "intent": slugify(question)[:60] or "new-entry",
            "locale": locale,
            "question": question,
            "variants": json.dumps(examples, ensure_ascii=False),
            "answer": draft,
        }
        out.append(
            {
                "size": len(members),
                "handoffs": routes["handoff"],
                "model_answers": routes["model"],
                "question": question,
                "examples": examples,
                "locale": locale,
                "last_seen": max(rows[i]["created_at"] for i in members).isoformat(),
                "draft_answer": draft,
                "draft_url": "/admin/routing/faqentry/add/?" + urlencode(form),
            }
        )
        if len(out) >= limit:
            break
    return out
