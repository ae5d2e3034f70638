"""The same question asked again after a complaint hands off (issue 30, item 4).

A complaint is a thumbs-down of a bot answer (the ``feedback`` frame) or a message that only says
the answer missed the question ("that's not what I asked", :func:`says_missed`, in every language
of the default ``KEFU_LANGUAGES``). Chat stores the question complained about on the conversation
(``Conversation.complaint_*``, read with the answering claim: no extra query) and hands it to the
router in the :class:`~routing.types.Question`. A new question within :data:`TURNS` turns that
asks it again goes to a person (:func:`asked_again`): the same FAQ intent when the FAQ model
accepts both questions (another intent: not a repeat), else an embedding cosine of at least
:data:`SIMILARITY` between the two.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata

import numpy as np

from cache_layer.embeddings import embed_async
from routing.faq.model import FaqMatch, normalise_text
from routing.faq.registry import registry
from routing.types import ROUTING_MAX_CHARS, Question

#: A complaint holds for this many turns (a turn: a shopper message and its answer, two seqs) after
#: it was made: the issue's "within 3 turns".
TURNS = 3
#: Cosine (unit embeddings of ``normalise_text``) at or above which a question rewords the one
#: complained about. Measured on bench/data/repeat_pairs.jsonl (bench/repeat_eval.py, tune half;
#: the held half's rates are in bench/README.md).
SIMILARITY = 0.92

#: "That's not what I asked" and its kin, per language (lower case, apostrophes straight).
MISSED: dict[str, tuple[str, ...]] = {
    "en": (
        "that's not what i asked",
        "that is not what i asked",
        "not what i asked",
        "that's not what i meant",
        "not what i meant",
        "that's not my question",
        "that doesn't answer my question",
        "that does not answer my question",
        "you didn't answer my question",
        "you did not answer my question",
        "that's not what i was asking",
        "i didn't ask that",
        "i did not ask that",
        "wrong answer",
    ),
    "zh": (
        "我不是问这个",
        "这不是我问的",
        "答非所问",
        "不是我要问的",
        "我问的不是这个",
        "你没有回答我的问题",
        "没回答我的问题",
        "不是这个意思",
    ),
    "ja": (
        "聞いたことと違います",
        "そういうことではありません",
        "質問の答えになっていません",
        "そんなこと聞いていません",
        "質問と違います",
    ),
    "ko": (
        "제가 물어본 게 아니에요",
        "그걸 물어본 게 아니에요",
        "질문에 대한 답이 아니에요",
        "제 질문에 답하지 않았어요",
        "그게 아니라고요",
    ),
    "es": (
        "eso no es lo que pregunté",
        "no es lo que pregunté",
        "no respondiste mi pregunta",
        "no has respondido a mi pregunta",
        "no pregunté eso",
    ),
    "fr": (
        "ce n'est pas ce que j'ai demandé",
        "ce n'est pas ma question",
        "vous n'avez pas répondu à ma question",
        "je n'ai pas demandé ça",
    ),
    "de": (
        "das habe ich nicht gefragt",
        "das war nicht meine frage",
        "das ist nicht meine frage",
        "das beantwortet meine frage nicht",
    ),
    "it": (
        "non è quello che ho chiesto",
        "non ho chiesto questo",
        "non hai risposto alla mia domanda",
        "non è la mia domanda",
    ),
    "pt": (
        "não foi isso que eu perguntei",
        "não é isso que eu perguntei",
        "você não respondeu minha pergunta",
        "não perguntei isso",
    ),
    "nl": (
        "dat is niet wat ik vroeg",
        "dat vroeg ik niet",
        "dat is niet mijn vraag",
        "je hebt mijn vraag niet beantwoord",
    ),
    "ru": (
        "я не об этом спрашивал",
        "я не это спрашивал",
        "это не то, что я спросил",
        "это не ответ на мой вопрос",
        "вы не ответили на мой вопрос",
    ),
}
_PHRASES = sorted({p for ps in MISSED.values() for p in ps}, key=len, reverse=True)
#: What may stand beside the phrase in a message that says nothing else ("No, that's not what I asked!").
_REST = re.compile(r"^(?:no|nope|sorry|but|um|hmm|不|不是|不对|いいえ|아니요|아뇨|non|nein|nee|não|нет)?$")

#: kefu's reply to a "that's not what I asked": an apology and a request to ask again.
REPLIES = {
    "en": "Sorry I missed your question. Could you ask it again in other words? If I get it wrong again, I'll pass you to a person.",
    "zh": "抱歉，我没理解您的问题。能换个说法再问一次吗？如果我还是答不上，会为您转接人工客服。",
    "ja": "ご質問を取り違えてしまい、申し訳ありません。別の言い方でもう一度お聞きいただけますか？また外れた場合は担当者におつなぎします。",
    "ko": "질문을 잘못 이해해 죄송합니다. 다른 말로 다시 한 번 물어봐 주시겠어요? 또 틀리면 상담원에게 연결해 드릴게요.",
    "es": "Perdón, no entendí tu pregunta. ¿Puedes hacerla de nuevo con otras palabras? Si vuelvo a fallar, te paso con una persona.",
    "fr": "Désolé, j'ai mal compris votre question. Pouvez-vous la reformuler ? Si je me trompe encore, je vous passe une personne de l'équipe.",
    "de": "Entschuldigung, da habe ich Ihre Frage falsch verstanden. Können Sie sie anders formulieren? Liege ich wieder daneben, verbinde ich Sie mit einer Person.",
    "it": "Scusa, non ho capito la domanda. Puoi riformularla? Se sbaglio di nuovo, ti passo a una persona.",
    "pt": "Desculpe, não entendi sua pergunta. Pode perguntar de novo com outras palavras? Se eu errar de novo, passo você para uma pessoa.",
    "nl": "Sorry, ik begreep je vraag niet goed. Kun je hem anders stellen? Zit ik er weer naast, dan verbind ik je met een medewerker.",
    "ru": "Извините, я неправильно понял вопрос. Можете задать его другими словами? Если я снова ошибусь, я передам вас сотруднику.",
}


def _folded(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower().replace("’", "'").replace("‘", "'")
    return " ".join(text.split())


def says_missed(text: str) -> bool:
    """Whether ``text`` only says the last answer missed the question ("that's not what I asked",
    any language of :data:`MISSED`, with at most a "no"/"sorry" and punctuation beside it). A
    message that goes on to ask something else is not one. Pure and cheap."""
    folded = _folded(text)
    if len(folded) > 80:
        return False
    for phrase in _PHRASES:
        if phrase in folded:
            rest = re.sub(r"[\W_]+", "", folded.replace(phrase, " "), flags=re.UNICODE)
            return bool(_REST.match(rest))
    return False


def missed_reply(locale: str) -> str:
    """kefu's reply to :func:`says_missed` in ``locale`` (English for a language it lacks)."""
    return REPLIES.get(locale, REPLIES["en"])


def complaint_in_reach(question: Question) -> bool:
    """Whether ``question`` comes within :data:`TURNS` turns of its conversation's complaint
    (``Question.complaint_*``), in the same session: the shopper's next ``TURNS`` messages after it
    (a turn is a shopper message and its answer, two seqs). Pure."""
    at = question.complaint_at_seq
    return bool(
        at and question.complaint_question and at >= question.session_from_seq and 0 < question.seq - at < 2 * TURNS
    )


def same_question(
    vector: np.ndarray | None,
    old_vector: np.ndarray | None,
    match: FaqMatch | None,
    old_match: FaqMatch | None,
    *,
    similarity: float = SIMILARITY,
) -> bool:
    """Whether a new question asks an old one again. When the FAQ model judged both (``match``,
    ``old_match``: neither None): both accepted, whether they have the same intent; one accepted
    and not the other, no. Otherwise (neither accepted, or a language the FAQ lacks) whether their
    unit embeddings (``(dim,)``) have a cosine of at least ``similarity`` (:data:`SIMILARITY`;
    False when either is None). Pure. The rule was chosen on the tune half of
    bench/data/repeat_pairs.jsonl (bench/README.md)."""
    if match is not None and old_match is not None:
        if match.accepted and old_match.accepted:
            return match.intent == old_match.intent
        if match.accepted != old_match.accepted:
            return False
    if vector is None or old_vector is None:
        return False
    return float(np.dot(old_vector, vector)) >= similarity


async def asked_again(
    question: Question, vector: np.ndarray | None, match: FaqMatch | None = None, locale: str = "en"
) -> str | None:
    """The handoff reason when ``question`` asks again the question its conversation complained
    about (``Question.complaint_*``) within :data:`TURNS` turns of the complaint
    (:func:`same_question`, with ``vector``: its unit embedding ``(dim,)`` and ``match``: its FAQ
    match in ``locale``, as ``routing.decide.classify`` computed them). None otherwise, and at once
    (nothing embedded or matched) when there is no complaint in reach. Raises what the embedder
    raises."""
    if not complaint_in_reach(question):
        return None
    old = question.complaint_question[:ROUTING_MAX_CHARS]
    norm = normalise_text(old)
    if not norm:
        return None
    old_vector = (await embed_async([norm]))[0]
    old_match = None
    snapshot = registry.snapshot
    if match is not None and snapshot.model is not None:
        old_match = await asyncio.to_thread(snapshot.model.match, old, locale=locale)
    if not same_question(vector, old_vector, match, old_match):
        return None
    if question.complaint_kind == "down":
        return "asked again after a thumbs-down"
    return 'asked again after "that\'s not what I asked"'
