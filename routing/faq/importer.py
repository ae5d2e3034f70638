"""Parse FAQ files (JSONL or CSV, UTF-8) into validated records, and write them.

Record fields (docs/protocol.md, ``import_faq``): ``question`` and ``answer`` (required, non-blank
strings), ``intent`` (optional slug; derived from the question when absent), ``locale`` (optional,
default ``en``), ``variants`` (optional list of strings; in CSV a JSON array). Unknown fields are
ignored. Records with the same (intent, locale) form one entry: the first record's question and
answer, every record's phrasings.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from django.db import transaction
from django.utils.text import slugify

from cache_layer.services import evict_for_faq_entry
from routing.models import FaqEntry

LOCALE = re.compile(r"^[a-z]{2,3}([-_][A-Za-z0-9]{2,8})?$")
MAX_TEXT = 20_000


class BadRecord(ValueError):
    """A record that cannot be imported; ``line`` is its 1-based line number in the file."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass
class FaqRecord:
    line: int
    intent: str
    locale: str
    question: str
    answer: str
    variants: list[str] = field(default_factory=list)


def _intent_from_question(question: str) -> str:
    slug = slugify(question)[:60].strip("-")
    digest = hashlib.sha1(question.strip().lower().encode()).hexdigest()[:8]
    return f"{slug}-{digest}" if slug else f"q-{digest}"


def validate(raw: object, line: int) -> FaqRecord:
    """One raw record (a dict) as a ``FaqRecord``; raises ``BadRecord`` naming what is wrong."""
    if not isinstance(raw, dict):
        raise BadRecord(line, "a record must be an object with 'question' and 'answer'")
    question, answer = raw.get("question"), raw.get("answer")
    for name, value in (("question", question), ("answer", answer)):
        if value is not None and not isinstance(value, str):
            raise BadRecord(line, f"'{name}' must be a string, not {type(value).__name__}")
        if not isinstance(value, str) or not value.strip():
            raise BadRecord(line, f"'{name}' is missing or blank")
        if len(value) > MAX_TEXT:
            raise BadRecord(line, f"'{name}' is longer than {MAX_TEXT} characters")
    assert isinstance(question, str) and isinstance(answer, str)
    intent = raw.get("intent")
    if intent is None or intent == "":
        intent = _intent_from_question(question)
    elif not isinstance(intent, str) or not re.fullmatch(r"[-a-zA-Z0-9_]{1,100}", intent):
        raise BadRecord(line, "'intent' must be letters, digits, '-' or '_' (at most 100)")
    locale = raw.get("locale") or "en"
    if not isinstance(locale, str) or not LOCALE.match(locale):
        raise BadRecord(line, f"'locale' {locale!r} is not a language code such as 'en' or 'zh'")
    variants = raw.get("variants") or []
    if isinstance(variants, str):
        try:
            variants = json.loads(variants)
        except ValueError:
            raise BadRecord(line, "'variants' must be a JSON array of strings") from None
    if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants):
        raise BadRecord(line, "'variants' must be a list of strings")
    return FaqRecord(
        line,
        intent,
        locale.replace("_", "-"),
        question.strip(),
        answer.strip(),
        [v.strip() for v in variants if v.strip()],
    )


def read_records(path: Path) -> Iterator[tuple[int, object]]:
    """Yield ``(line, raw record)`` from a ``.csv`` file (header row) or a JSONL file (one object a
    line, blank lines skipped). A JSONL line that is not UTF-8 or not JSON yields a ``BadRecord``
    as its record. Raises ``UnicodeDecodeError`` (naming the line) for a CSV file that is not UTF-8."""
    data = path.read_bytes()
    if path.suffix.lower() != ".csv":
        # JSONL: each line decodes on its own, so one bad byte costs only its line.
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        for n, raw_line in enumerate(data.split(b"\n"), 1):
            try:
                line = raw_line.decode("utf-8").rstrip("\r")
            except UnicodeDecodeError as e:
                yield n, BadRecord(n, f"not UTF-8 text ({e.reason} at byte {e.start} of the line)")
                continue
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except ValueError as e:  # json.JSONDecodeError, with its message in ``msg``
                yield n, BadRecord(n, f"not valid JSON ({getattr(e, 'msg', e)})")
        return
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line_no = data[: e.start].count(b"\n") + 1
        raise UnicodeDecodeError(e.encoding, e.object, e.start, e.end, f"{e.reason} on line {line_no}") from None
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        start = 2
        for row in reader:
            yield start, dict(row)
            start = reader.line_num + 1
        return


@dataclass
class ImportResult:
    created: int = 0
    updated: int = 0
    errors: list[BadRecord] = field(default_factory=list)


def faq_import(records: list[FaqRecord]) -> ImportResult:
    """Create or update one entry per (intent, locale) of ``records``, in one transaction."""
    grouped: dict[tuple[str, str], FaqRecord] = {}
    for r in records:
        key = (r.intent, r.locale)
        if key in grouped:
            g = grouped[key]
            g.variants.extend([r.question, *r.variants])
        else:
            grouped[key] = FaqRecord(r.line, r.intent, r.locale, r.question, r.answer, list(r.variants))
    result = ImportResult()
    changed: list[int] = []
    with transaction.atomic():
        for (intent, locale), r in grouped.items():
            variants = [v for v in dict.fromkeys(r.variants) if v != r.question]
            before = (
                FaqEntry.objects.filter(intent=intent, locale=locale)
                .values_list("question", "answer", "variants", "active")
                .first()
            )
            entry, created = FaqEntry.objects.update_or_create(
                intent=intent,
                locale=locale,
                defaults={"question": r.question, "answer": r.answer, "variants": variants, "active": True},
            )
            if created:
                result.created += 1
            else:
                result.updated += 1
                if before != (r.question, r.answer, variants, True):
                    changed.append(entry.pk)
        for entry_id in changed:
            faq_entry_changed(entry_id)
    return result


def faq_entry_changed(entry_id: int) -> int:
    """An entry's text changed: evict the cached remote answers grounded on it (their count)."""
    return evict_for_faq_entry(entry_id)
