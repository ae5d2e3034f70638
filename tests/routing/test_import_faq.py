"""``manage.py import_faq``: JSONL and CSV, merging, re-import, bad records with line numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from routing.models import FaqEntry

pytestmark = pytest.mark.django_db


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8"
    )
    return path


def test_jsonl_import_groups_by_intent_and_locale(tmp_path, capsys):
    f = write_jsonl(
        tmp_path / "faq.jsonl",
        [
            {
                "intent": "returns",
                "question": "Can I return this?",
                "answer": "Yes, within 30 days.",
                "variants": ["return policy?"],
            },
            {
                "intent": "returns",
                "question": "How do I send it back?",
                "answer": "ignored: first record's answer wins",
            },
            {
                "intent": "returns",
                "locale": "zh",
                "question": "可以退货吗？",
                "answer": "可以，30天内。",
                "extra": "ignored",
            },
        ],
    )
    call_command("import_faq", str(f))
    en = FaqEntry.objects.get(intent="returns", locale="en")
    assert en.answer == "Yes, within 30 days."
    assert en.phrasings == ["Can I return this?", "return policy?", "How do I send it back?"]
    assert FaqEntry.objects.get(intent="returns", locale="zh").question == "可以退货吗？"
    assert "2 entries created" in capsys.readouterr().out


def test_reimport_updates_instead_of_duplicating(tmp_path):
    f = write_jsonl(tmp_path / "faq.jsonl", [{"intent": "hours", "question": "When are you open?", "answer": "9-5"}])
    call_command("import_faq", str(f))
    write_jsonl(f, [{"intent": "hours", "question": "When are you open?", "answer": "9-6 now"}])
    call_command("import_faq", str(f))
    assert FaqEntry.objects.count() == 1
    assert FaqEntry.objects.get().answer == "9-6 now"


def test_csv_import_with_json_variants(tmp_path):
    f = tmp_path / "faq.csv"
    f.write_text(
        "question,answer,intent,locale,variants\n"
        '"Do you ship abroad?","Yes, to 30 countries.\nSee the list.",intl,en,"[""international shipping?""]"\n'
        "多久发货？,24小时内。,dispatch,zh,\n",
        encoding="utf-8",
    )
    call_command("import_faq", str(f))
    intl = FaqEntry.objects.get(intent="intl")
    assert intl.answer == "Yes, to 30 countries.\nSee the list." and intl.variants == ["international shipping?"]
    assert FaqEntry.objects.get(intent="dispatch").locale == "zh"


def test_bad_records_are_named_by_line_and_good_ones_still_load(tmp_path, capsys):
    f = write_jsonl(
        tmp_path / "faq.jsonl",
        [
            {"intent": "ok1", "question": "Q1?", "answer": "A1"},
            "{not json",
            {"intent": "bad", "question": "", "answer": "A"},
            {"intent": "bad2", "question": "Q?", "answer": "A", "variants": "not a list"},
            {"intent": "ok2", "question": "Q2?", "answer": "A2"},
        ],
    )
    with pytest.raises(SystemExit) as exit_info:
        call_command("import_faq", str(f))
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert ":2: not valid JSON" in err and ":3: 'question' is missing or blank" in err and ":4: 'variants'" in err
    assert sorted(FaqEntry.objects.values_list("intent", flat=True)) == ["ok1", "ok2"]


def test_atomic_loads_nothing_when_any_record_is_bad(tmp_path):
    FaqEntry.objects.create(intent="kept", question="Old?", answer="Old answer")
    f = write_jsonl(
        tmp_path / "faq.jsonl",
        [
            {"intent": "kept", "question": "Old?", "answer": "New answer"},
            {"intent": "x", "answer": "no question"},
        ],
    )
    with pytest.raises(CommandError, match="nothing imported"):
        call_command("import_faq", str(f), "--atomic")
    assert FaqEntry.objects.get().answer == "Old answer"  # nothing already stored is lost


def test_csv_bad_row_reports_its_line(tmp_path, capsys):
    f = tmp_path / "faq.csv"
    f.write_text('question,answer\n"multi\nline question",A1\n,missing question\n', encoding="utf-8")
    with pytest.raises(SystemExit):
        call_command("import_faq", str(f))
    assert ":4: 'question' is missing or blank" in capsys.readouterr().err
    assert FaqEntry.objects.count() == 1


def test_a_jsonl_line_that_is_not_utf8_costs_only_that_line(tmp_path, capsys):
    f = tmp_path / "faq.jsonl"
    f.write_bytes(
        b'{"intent": "a", "question": "A?", "answer": "a"}\n'
        + '{"intent": "b", "question": "caf\xe9?", "answer": "b"}\n'.encode("latin-1")
        + b'{"intent": "c", "question": "C?", "answer": "c"}\n'
    )
    with pytest.raises(SystemExit):
        call_command("import_faq", str(f))
    assert ":2: not UTF-8 text" in capsys.readouterr().err
    assert sorted(FaqEntry.objects.values_list("intent", flat=True)) == ["a", "c"]


def test_csv_that_is_not_utf8_names_the_line(tmp_path):
    f = tmp_path / "faq.csv"
    f.write_bytes(b"question,answer\nA?,a\n" + "caf\xe9?,b\n".encode("latin-1"))
    with pytest.raises(CommandError, match="not UTF-8.*line 3"):
        call_command("import_faq", str(f))
    assert FaqEntry.objects.count() == 0


def test_non_string_question_is_named_as_such(tmp_path, capsys):
    f = write_jsonl(tmp_path / "faq.jsonl", [{"intent": "n", "question": 123, "answer": "x"}])
    with pytest.raises(SystemExit):
        call_command("import_faq", str(f))
    assert ":1: 'question' must be a string, not int" in capsys.readouterr().err


def test_if_empty_skips_a_store_that_has_a_faq(tmp_path):
    FaqEntry.objects.create(intent="mine", question="Mine?", answer="Mine.")
    f = write_jsonl(tmp_path / "faq.jsonl", [{"intent": "demo", "question": "Demo?", "answer": "Demo."}])
    call_command("import_faq", str(f), "--if-empty")
    assert list(FaqEntry.objects.values_list("intent", flat=True)) == ["mine"]


def test_missing_intent_is_derived_from_the_question(tmp_path):
    f = write_jsonl(
        tmp_path / "faq.jsonl",
        [{"question": "Do you gift wrap?", "answer": "Yes."}, {"question": "Do you gift wrap?", "answer": "Yes."}],
    )
    call_command("import_faq", str(f))
    entry = FaqEntry.objects.get()
    assert entry.intent.startswith("do-you-gift-wrap-")


def test_demo_faq_file_is_valid_and_bilingual(tmp_path):
    demo = Path(__file__).resolve().parents[2] / "routing" / "demo" / "faq_demo.jsonl"
    call_command("import_faq", str(demo))
    assert FaqEntry.objects.filter(locale="en").count() >= 15
    assert FaqEntry.objects.filter(locale="zh").count() >= 15
    assert FaqEntry.objects.count() >= 30
    assert all(len(e.phrasings) >= 5 for e in FaqEntry.objects.all())
