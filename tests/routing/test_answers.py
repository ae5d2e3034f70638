"""Fixed texts in the answer's own language: FAQ placeholders are filled per locale (no English
inside a Chinese answer), a locale without its own values falls back to English, and the store's
KEFU_STORE_PLACEHOLDERS may give one value per locale."""

from __future__ import annotations

import pytest

from lib.text import CJK
from routing.decide.answers import fill_placeholders

ZH_CONTACT = "您可以拨打 {{Support Phone}}（服务时间：{{Support Hours}}）联系 {{Store Name}} 团队。"
EN_CONTACT = "Call {{Support Phone}} (hours: {{Support Hours}}) to reach the {{Store Name}} team."


def test_a_chinese_answer_gets_chinese_values():
    text = fill_placeholders(ZH_CONTACT, "zh")
    assert text == "您可以拨打 +1 555 010 0199（服务时间：周一至周五 9:00-18:00）联系 Lantern & Loom 团队。"
    assert "Monday" not in text


def test_an_english_answer_and_an_unknown_locale_get_english_values():
    expected = "Call +1 555 010 0199 (hours: Monday to Friday, 9:00-18:00) to reach the Lantern & Loom team."
    assert fill_placeholders(EN_CONTACT, "en") == expected
    assert fill_placeholders(EN_CONTACT, "es") == expected  # no Spanish texts: English


def test_the_stores_values_may_be_given_per_locale(settings):
    settings.KEFU_STORE_PLACEHOLDERS = {
        "Support Hours": {"en": "every day, 8-20", "zh": "每天 8 点到 20 点"},
        "Support Phone": "+44 20 0000 0000",
    }
    assert fill_placeholders("{{Support Hours}} / {{Support Phone}}", "zh") == "每天 8 点到 20 点 / +44 20 0000 0000"
    assert fill_placeholders("{{Support Hours}} / {{Support Phone}}", "en") == "every day, 8-20 / +44 20 0000 0000"
    assert fill_placeholders("{{Support Hours}}", "es") == "every day, 8-20"


@pytest.mark.parametrize(
    ("name", "zh", "en"),
    [
        ("{{Order Number Anonymized}}", "您的订单", "your order"),
        ("{{Customer Support Phone Number}}", "+1 555 010 0199", "+1 555 010 0199"),
        ("{{Refund Amount}}", "退款金额", "the refund amount"),
    ],
)
def test_placeholders_the_store_left_unset_read_as_words_of_the_answers_language(name, zh, en):
    assert fill_placeholders(f"查询{name}。", "zh") == f"查询{zh}。"
    assert fill_placeholders(f"Look up {name}.", "en") == f"Look up {en}."


def test_the_demo_faqs_chinese_answers_get_no_english_placeholder_values():
    import json
    from pathlib import Path

    rows = [json.loads(line) for line in (Path("routing/demo/faq_demo.jsonl").read_text().splitlines()) if line]
    for row in rows:
        if row["locale"] != "zh":
            continue
        text = fill_placeholders(row["answer"], "zh")
        assert CJK.search(text)
        assert "Monday" not in text and "{{" not in text, (row["intent"], text)
