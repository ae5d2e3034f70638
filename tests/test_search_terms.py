"""lib.search_terms: the terms a message is indexed under and the terms a query asks for."""

from __future__ import annotations

from lib.search_terms import MAX_TERMS, index_terms, looks_like_email, query_terms


def terms(text: str) -> set[str]:
    return set(index_terms(text).split())


def found(query: str, text: str) -> bool:
    """What chat.search does with the terms: every query term is a term of the text, and every
    long unspaced phrase is in the text as written."""
    q = query_terms(query)
    return bool(q.terms) and set(q.terms) <= terms(text) and all(p in text for p in q.phrases)


def test_chinese_one_and_two_character_words_are_terms():
    t = terms("我想退货，谢谢")
    assert {"退货", "谢谢", "我", "退", "货"} <= t
    assert "货谢" not in t  # the comma ends the run: no bigram across punctuation
    assert query_terms("退货").terms == ("退货",)
    assert query_terms("货").terms == ("货",)


def test_longer_chinese_words_are_bigrams_checked_as_a_phrase():
    q = query_terms("退货政策")
    assert q.terms == ("退货", "货政", "政策") and q.phrases == ("退货政策",)
    assert found("退货政策", "请问你们的退货政策是什么")
    # Every bigram is there, but not the word: the phrase check refuses it.
    assert not found("退货政策", "退货 货政 政策")


def test_spaced_scripts_are_words_case_folded():
    assert {"where", "is", "my", "parcel", "strasse", "посылка"} <= terms("Where is my PARCEL? Straße посылка")
    assert found("parcel", "Where is my PARCEL?")
    assert not found("parcels", "Where is my parcel?")


def test_emails_are_whole_terms_and_queries():
    t = terms("write to Ann.Lee+shop@Example.COM please")
    assert "ann.lee+shop@example.com" in t
    q = query_terms(" ANN.LEE+shop@example.com ")
    assert q.email == "ann.lee+shop@example.com" and q.terms == ("ann.lee+shop@example.com",)
    assert not found("ann.lee@example.com", "write to ann.lee+shop@example.com")
    assert looks_like_email("a@b.co") and not looks_like_email("a@b")


def test_order_numbers_in_any_spelling():
    text = "Where is order KF-1042?"
    for q in ("KF-1042", "kf1042", "#1042", "1042", "ＫＦ－１０４２"):
        assert found(q, text), q
    assert found("#1042", "my order #1042 is late")
    assert not found("KF-1043", text)


def test_the_same_text_gives_the_same_terms_and_they_are_bounded():
    assert index_terms("你好 hello") == index_terms("你好 hello")
    assert index_terms("") == "" and query_terms("?!").terms == ()
    long = "".join(chr(0x4E00 + i) for i in range(5000))
    assert len(index_terms(long).split()) == MAX_TERMS
