"""Handoffs decided by the conversation, not by one message: the shopper accepts an offer of a
person that the bot made in its last answer ("Would you like me to connect you with someone
from our team?" -> "yes please").

An offer is detected in the answer's text, in every language of ``routing.decide.handoff_intent``
(a template's or the remote model's words alike): a question (a sentence ending in ``?``/``？``)
in which a contact word meets a person word, as in a shopper's request. An acceptance is a short
yes in the shopper's language (``ACCEPT``), nothing more.
"""

from __future__ import annotations

import re

from routing.decide.handoff_intent import asks_in
from routing.types import HistoryLoader, Question

#: A question of the bot's answer: a run of text up to a question mark.
_QUESTION = re.compile(r"[^.!?。！？\n]*[?？]")

#: Short yeses, per language (whole message, with polite filler and punctuation around it).
_YES: dict[str, tuple[str, ...]] = {
    "en": ("yes", "yeah", "yep", "yup", "sure", "ok", "okay", "please", "please do", "go ahead", "yes please", "do it"),
    "zh": ("是", "是的", "好", "好的", "可以", "要", "行", "嗯", "好啊", "麻烦了", "麻烦你了", "需要"),
    "ja": ("はい", "お願いします", "ええ", "うん", "お願い"),
    "ko": ("네", "예", "좋아요", "부탁해요", "응", "부탁드려요"),
    "es": ("sí", "si", "claro", "vale", "de acuerdo", "por favor"),
    "fr": ("oui", "d'accord", "volontiers", "ok", "s'il vous plaît", "oui merci"),
    "de": ("ja", "gerne", "gern", "bitte", "ja bitte", "okay"),
    "it": ("sì", "si", "certo", "va bene", "per favore", "volentieri"),
    "pt": ("sim", "claro", "pode ser", "por favor", "quero"),
    "nl": ("ja", "graag", "ja graag", "prima", "goed"),
    "ru": ("да", "конечно", "давай", "давайте", "хорошо", "пожалуйста"),
}
_FILLER = r"(?:please|thanks|thank you|por favor|gracias|merci|s'il vous plaît|bitte|danke|per favore|grazie|obrigad[oa]|alstublieft|dank je|пожалуйста|спасибо|谢谢|请|お願いします|ありがとう|감사합니다|주세요)"
ACCEPT = re.compile(
    r"^\W*(?:"
    + "|".join(re.escape(y) for ys in _YES.values() for y in sorted(ys, key=len, reverse=True))
    + rf")(?:[\s,，、!！.。~]*{_FILLER})*[\s!！.。~～]*$",
    re.IGNORECASE,
)


def accepts(text: str) -> bool:
    """Whether ``text`` is nothing but a short yes (any language of ``_YES``)."""
    return len(text) <= 40 and bool(ACCEPT.match(text))


def offers_person(answer: str, locale: str = "en") -> bool:
    """Whether the bot's ``answer`` (in ``locale``) offers a person: one of its questions has a
    contact word near a person word (``routing.decide.handoff_intent`` phrase data of ``locale``,
    then English's). Pure and cheap."""
    questions = _QUESTION.findall(answer)
    if not questions:
        return False
    return any(asks_in(q, lang) for lang in dict.fromkeys((locale, "en")) for q in questions)


async def accepted_offer(question: Question, history: HistoryLoader) -> str | None:
    """The handoff reason when ``question`` is a short yes to a person offered by the bot's last
    answer (that answer in the question's conversation language), else ``None``. Loads one turn
    of history, only for a short yes after the conversation's first message. Raises what
    ``history`` raises."""
    if question.seq <= 1 or not accepts(question.text):
        return None
    past = await history(before_seq=question.seq, turns=1)
    bot = [body for role, body in past.turns if role == "bot" and body]
    if bot and offers_person(bot[-1], question.locale):
        return "shopper accepted the offer of a person"
    return None
