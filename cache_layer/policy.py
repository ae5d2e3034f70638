"""What may be cached: personal data, context-dependent questions, links to other sites and
payment instructions are never shared.

An answer made for one shopper is served to every other shopper whose question matches, so a
question or answer that carries anything personal (order or invoice numbers, e-mail addresses,
phone numbers, card numbers, street addresses, names) must never be stored. A follow-up ("and the
blue one?") only makes sense with the turns before it, so it is neither stored nor looked up until
it has been rewritten into a standalone question (issue 3, point 3).

An answer is also refused when it carries a link to a domain that is not the store's own nor one
it lists (``KEFU_ANSWER_LINK_DOMAINS``), or payment instructions ("transfer the amount to IBAN
...", "转账到...", "envíe el pago a ..."): a shopper may have talked the model into them (issue 29,
point 2), and a shared answer would hand them to every shopper asking the same question.

The rules are deliberately broad: a refused store costs one remote answer; a wrong one leaks data.
Every function returns a short machine-readable reason so the caller can log why.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from django.conf import settings

from lib.links import foreign_links, host_of
from lib.text import CJK_CLASS

_CJK = CJK_CLASS

# Order, invoice, tracking and account numbers: any run of 5+ digits (Bitext's order ids are
# 6-15 digits; the check's are 8). Five keeps postcodes out too, which are personal with a street.
_LONG_DIGITS = re.compile(r"(?<!\d)\d{5,}(?!\d)")
#: An e-mail address (also masked before model calls, routing.prompt.privacy).
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", re.UNICODE)
# Phone numbers: 7+ digits in groups joined by spaces, dots, dashes or brackets, optional "+".
_PHONE = re.compile(r"(?:\+\s?)?\(?\d{2,4}\)?(?:[\s.-]?\(?\d{2,5}\)?){2,5}")
# Card numbers: 13-19 digits, optionally grouped by spaces or dashes; confirmed by Luhn.
_CARD = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")
_STREET_EN = re.compile(
    r"\b\d{1,5}[a-z]?\s+(?:[a-z]+\s+){0,3}(?:street|st|avenue|ave|road|rd|lane|ln|drive|dr|boulevard|blvd|"
    r"way|court|ct|place|pl|terrace|crescent|close|square|sq|highway|hwy)\b\.?",
    re.IGNORECASE,
)
_STREET_ZH = re.compile(rf"[{_CJK}]{{1,12}}(?:路|街|道|巷|弄|胡同)\s?\d+\s?(?:号|弄)|\d+\s?(?:号楼|单元|室)")
# Self-introductions. "I am X" only counts with a capitalised X in the original text, so
# "I am unhappy" is not a name, "I am Alice" is.
_NAME_EN = re.compile(r"\b(?:my name is|my name's|my full name is)\s+\w+", re.IGNORECASE)
_NAME_EN_CAP = re.compile(r"\b(?:I am|I'm|Im|this is|call me)\s+(?!I\b|A\b|An\b|The\b|Not\b|So\b|Very\b)[A-Z][a-z]+")
_NAME_ZH = re.compile(rf"我叫[{_CJK}A-Za-z]|我的名字(?:是|叫)|本人姓|我姓[{_CJK}]")
# "Mr. Smith", "Dr Jones", "Mrs. Lee", "mr smith": the title in any case, the name capitalised
# (or all lower case after a title written in lower case).
_HONORIFIC = re.compile(
    r"\b(?:[Mm](?:r|rs|s|iss|x)|[Dd]r|[Pp]rof|[Ss]ir|[Mm]adam)\.?\s+[A-Z][a-z]+|\b(?:mr|mrs|ms|dr)\.?\s+[a-z]{2,}\b"
)
# An answer that greets or thanks someone by name ("Thanks, Alice!", "Hi Bob,", "Dear Ms Chen"):
# made for one shopper. A capitalised word after the greeting, then a comma, "!" or "." (or the end).
_GREETED_BY_NAME = re.compile(
    r"(?:^|[.!?]\s+)(?:hi|hello|hey|thanks|thank you|dear|welcome back|sorry|good (?:morning|afternoon|evening))"
    r",?\s+(?!there\b|again\b|for\b|so\b|very\b|all\b|everyone\b|and\b|you\b)([A-Z][a-z]+)\s*(?:[,!.]|$)",
    re.IGNORECASE,
)


# Payment instructions: where to send money, in English, Chinese and Spanish. An IBAN, a crypto
# wallet address, or wording that points a payment somewhere ("pay to", "wire the amount to",
# "转账到", "envíe el pago a"). Naming payment methods ("we accept bank transfer and PayPal") is
# not an instruction and passes.
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b")
_CRYPTO_ADDRESS = re.compile(
    r"\b(?:0x[0-9a-fA-F]{40}|bc1[02-9ac-hj-np-z]{25,60}|[13][1-9A-HJ-NP-Za-km-z]{25,34}|T[1-9A-HJ-NP-Za-km-z]{33})\b"
)
_PAYMENT_EN = re.compile(
    r"\b(?:pay(?:ment)?s?|send|sending|transfer|transferring|wire|wiring|deposit|remit)\b"
    r"(?:\s+(?:the|your|this|it|all|full|total|money|funds|amount|payment|balance|directly|instead|now|first|"
    r"\$?\d[\d.,]*|usd|eur|dollars?|euros?)){0,4}\s+(?:to|into|via|at)\s+(?:(?:our|my|this|the|a|an)\s+)?"
    r"(?:account|wallet|address|iban|paypal|venmo|zelle|cash\s?app|western\s+union|moneygram|bank|"
    r"bitcoin|btc|usdt|eth|crypto|https?://|www\.|[a-z0-9.-]+\.[a-z]{2,24}\b)"
    r"|\b(?:iban|swift(?:/bic)?|bic|sort\s+code|routing\s+number|account\s+number|beneficiary|wallet\s+address|"
    r"(?:bitcoin|btc|crypto(?:currency)?|usdt|ethereum)\s+(?:wallet|address))\b"
    r"|\bpay\s+(?:with|using|in)\s+(?:gift\s+cards?|itunes|steam\s+cards?|bitcoin|crypto)",
    re.IGNORECASE,
)
_PAYMENT_ZH = re.compile(
    r"(?:转账|汇款|打款|付款|支付|转入|汇入|打钱|充值)(?:[^。！？\n]{0,12})?(?:到|至|给)(?:[^。！？\n]{0,12})?"
    r"(?:账户|账号|帐户|帐号|卡号|钱包|地址|收款)"
    r"|收款(?:账户|账号|帐户|帐号|人|码|地址)|银行(?:账号|帐号|卡号)|钱包地址|(?:比特币|加密货币|以太坊|USDT)(?:钱包|地址)"
    r"|私下(?:转账|付款|交易)"
)
_PAYMENT_ES = re.compile(
    r"\b(?:pag(?:a|ar|ue|uen)|env(?:í|i)(?:a|ar|e|en)|transf(?:iere|erir|iera|ieran)|deposit(?:a|ar|e|en)|"
    r"ingres(?:a|ar|e|en)|gir(?:a|ar|e|en))\b"
    r"(?:\s+(?:el|la|los|las|su|tu|dinero|pago|importe|monto|total|fondos|saldo|directamente|\d[\d.,]*|€|\$)){0,4}"
    r"\s+(?:a|en|al)\s+(?:(?:la|el|nuestra|nuestro|esta|este|mi)\s+)?"
    r"(?:cuenta|billetera|cartera|monedero|direcci(?:ó|o)n|iban|paypal|bizum|bitcoin|cripto)"
    r"|\b(?:n(?:ú|u)mero\s+de\s+cuenta|cuenta\s+bancaria\s+(?:n(?:ú|u)mero|es)|"
    r"(?:billetera|cartera|monedero)\s+(?:de\s+)?(?:bitcoin|cripto\w*|usdt)|direcci(?:ó|o)n\s+de\s+(?:la\s+)?(?:billetera|cartera))\b",
    re.IGNORECASE,
)


def payment_instructions(text: str) -> str | None:
    """The kind of payment instruction in ``text`` or ``None``: ``"iban"`` (an IBAN-shaped
    account number), ``"crypto_address"`` (a Bitcoin, Ethereum or Tron address), ``"payment_en"``,
    ``"payment_zh"``, ``"payment_es"`` (wording that points a payment to an account, wallet,
    address or site). Checked on the NFKC form."""
    t = unicodedata.normalize("NFKC", text)
    if _IBAN.search(t):
        return "iban"
    if _CRYPTO_ADDRESS.search(t):
        return "crypto_address"
    for kind, pattern in (("payment_en", _PAYMENT_EN), ("payment_zh", _PAYMENT_ZH), ("payment_es", _PAYMENT_ES)):
        if pattern.search(t):
            return kind
    return None


def link_domains() -> list[str]:
    """The domains an answer shared with other shoppers may link to (normalised hosts,
    ``lib.links.normalise_host``; a subdomain of one is allowed too): the store's own, read from
    the hosts of ``KEFU_WIDGET_ORIGINS``, ``ALLOWED_HOSTS`` (not ``*``), ``KEFU_SHOPIFY_SHOP``,
    ``CSRF_TRUSTED_ORIGINS`` and the URL values of ``KEFU_STORE_PLACEHOLDERS``, plus those
    listed in ``KEFU_ANSWER_LINK_DOMAINS``. Sorted, without duplicates."""
    sources: list[str] = [
        *getattr(settings, "KEFU_WIDGET_ORIGINS", []),
        *(h for h in getattr(settings, "ALLOWED_HOSTS", []) if h.strip(".") not in {"*", ""}),
        *getattr(settings, "CSRF_TRUSTED_ORIGINS", []),
        getattr(settings, "KEFU_SHOPIFY_SHOP", ""),
        *getattr(settings, "KEFU_ANSWER_LINK_DOMAINS", []),
    ]
    placeholders = getattr(settings, "KEFU_STORE_PLACEHOLDERS", {}) or {}
    sources += [v for v in placeholders.values() if isinstance(v, str) and ("//" in v or v.startswith("www."))]
    hosts = {host_of(s) for s in sources if isinstance(s, str)}
    return sorted(h for h in hosts if h and h != "*")


def may_share_answer(text: str, domains: Iterable[str]) -> tuple[bool, str]:
    """Whether an answer's links and wording let it reach other shoppers: ``(ok, reason)``.

    Reasons: ``"ok"``, ``"foreign_link"`` (a link whose host is not one of ``domains`` nor under
    one, ``lib.links.foreign_links``), or a kind of :func:`payment_instructions` (``"iban"``,
    ``"crypto_address"``, ``"payment_en"``...)."""
    if foreign_links(text, domains):
        return False, "foreign_link"
    kind = payment_instructions(text)
    if kind:
        return False, kind
    return True, "ok"


def luhn_ok(digits: str) -> bool:
    """True when ``digits`` (only 0-9) passes the Luhn checksum used by payment cards."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _inside_word(t: str, m: re.Match[str]) -> bool:
    """True when the match sits inside a longer token with a letter right before AND right after
    it ("Acc41652be85a", a hash or a SKU): that is not an order or phone number. An identifier
    with a letter prefix only ("ORD48213377") or suffix only still counts."""
    before = t[m.start() - 1] if m.start() > 0 else " "
    after = t[m.end()] if m.end() < len(t) else " "
    return before.isalpha() and after.isalpha()


def street_address_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each street address in ``text`` ("221B Baker Street", "南京路100号"),
    in order; the patterns :func:`personal_data` calls ``street_address``."""
    spans = [(m.start(), m.end()) for pattern in (_STREET_EN, _STREET_ZH) for m in pattern.finditer(text)]
    return sorted(spans)


def personal_data(text: str) -> str | None:
    """The kind of personal data found in ``text`` (``"order_number"``, ``"email"``, ...) or ``None``.

    Checked on the NFKC form so full-width digits ("１２３４５") count as digits.
    """
    t = unicodedata.normalize("NFKC", text)
    if EMAIL.search(t):
        return "email"
    for m in _CARD.finditer(t):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and luhn_ok(digits) and not _inside_word(t, m):
            return "card_number"
    if any(not _inside_word(t, m) for m in _LONG_DIGITS.finditer(t)):
        return "order_number"
    for m in _PHONE.finditer(t):
        if len(re.sub(r"\D", "", m.group())) >= 7 and not _inside_word(t, m):
            return "phone_number"
    if _STREET_EN.search(t) or _STREET_ZH.search(t):
        return "street_address"
    if _NAME_EN.search(t) or _NAME_EN_CAP.search(t) or _NAME_ZH.search(t) or _HONORIFIC.search(t):
        return "name"
    return None


# --- Follow-ups ----------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z']+")
# Openers that lean on the previous turn ("and the blue one?", "what about returns?").
_FOLLOW_OPENERS_EN = re.compile(
    r"^(?:and|also|but|or|so|then|plus|what about|how about|what if|same for|same with|ok and|okay and)\b"
)
_PRONOUNS_EN = {
    "it",
    "its",
    "it's",
    "itself",
    "that",
    "this",
    "those",
    "these",
    "they",
    "them",
    "their",
    "one",
    "ones",
    "he",
    "she",
    "him",
    "her",
    "same",
    "other",
    "instead",
    "either",
    "neither",
}
# Words that start a sentence yet refer back ("It doesn't fit", "That one is broken").
_PRONOUN_LEAD_EN = {"it", "its", "it's", "that", "this", "those", "these", "they", "them", "same", "which one"}
_FOLLOW_OPENERS_ZH = re.compile(r"^(?:那|那么|还有|另外|然后|而且|再|那个|这个|它)")
_DEICTIC_ZH = re.compile(r"它|这个|那个|这款|那款|这件|那件|这种|那种|这双|那双|这些|那些|同样|一样的")
# Replies that only make sense after the bot's last turn: "不行哦", "好的亲", "ok thanks", "yes
# please", "sí", "はい". After the polite particles are stripped, a Chinese turn of at most
# SHORT_REPLY_ZH_CHARS characters is one (a two-character topic such as "运费" is then a miss, not a
# wrong hit: it is rewritten from the conversation first).
_REPLY_PARTICLES_ZH = re.compile(r"[哦噢喔啊呀吧嘛呢啦哈嗯亲的了吗么]+")
SHORT_REPLY_ZH_CHARS = 3
_REPLY_WORDS = {
    "yes",
    "yeah",
    "yep",
    "yup",
    "no",
    "nope",
    "nah",
    "ok",
    "okay",
    "k",
    "sure",
    "fine",
    "great",
    "good",
    "cool",
    "perfect",
    "right",
    "correct",
    "wrong",
    "thanks",
    "thank",
    "you",
    "please",
    "pls",
    "not",
    "really",
    "sounds",
    "alright",
    "agreed",
    "done",
    "same",
    "again",
    "why",
    "how",
    "so",
    "then",
    "what",
    "huh",
    "hmm",
    "maybe",
    "exactly",
    "true",
    "false",
    "never",
    "mind",
    "si",
    "sí",
    "vale",
    "claro",
    "gracias",
    "oui",
    "non",
    "merci",
    "ja",
    "nein",
    "danke",
    "sim",
    "não",
}
# Openers that lean on the previous turn in other languages: Spanish, French, German, Portuguese,
# Italian ("y el azul?", "et en noir ?", "und in blau?"), Japanese ("それは", "じゃあ", "あと").
_FOLLOW_OPENERS_OTHER = re.compile(
    r"^(?:(?:y|e|et|und|o|ou|oder|pero|mais|aber|ma|entonces|alors|dann|então|quindi|y qué|et pour|und was)\b"
    r"|それ|あれ|これ|じゃあ|では|あと|で、|そちら)"
)
#: Questions this short (words) with a back-referring pronoun are taken as follow-ups.
SHORT_EN_WORDS = 7
#: Chinese questions this short (characters) ending in 呢 or with a deictic word are follow-ups.
SHORT_ZH_CHARS = 12


def is_follow_up(text: str) -> bool:
    """True when ``text`` probably depends on earlier turns and must not be cached as it stands.

    English: opens with a connective ("and", "what about", ...), opens with a pronoun, or is short
    (at most :data:`SHORT_EN_WORDS` words) and holds a back-referring pronoun ("how much is it?",
    "can I return that one?"), or is only reply words ("ok thanks", "yes please"). Chinese: opens
    with 那/还有/另外..., ends in 呢 while short, is short and holds a deictic word (它, 这个,
    那款...), or is a bare reply of at most three characters once particles are dropped ("不行哦",
    "好的亲"). Other languages: a connective opener ("y el azul?", "et en noir ?", "それは？").
    Over-matching only costs a cache miss.
    """
    t = unicodedata.normalize("NFKC", text).strip().lower()
    if not t:
        return False
    t = re.sub(r"^[¿¡\s]+", "", t)
    if _FOLLOW_OPENERS_OTHER.match(t):
        return True
    cjk = re.findall(rf"[{_CJK}]", t)
    if cjk:
        if _FOLLOW_OPENERS_ZH.match(t):
            return True
        core_zh = _REPLY_PARTICLES_ZH.sub("", "".join(cjk))
        if len(core_zh) <= SHORT_REPLY_ZH_CHARS and not re.search(r"[a-z0-9]", t):
            return True
        core = re.sub(r"[\s?？!！。.,，~]+$", "", t)
        if core.endswith("呢") and len(cjk) <= SHORT_ZH_CHARS:
            return True
        if _DEICTIC_ZH.search(t) and len(cjk) <= SHORT_ZH_CHARS:
            return True
    t_en = t.replace("’", "'")
    if _FOLLOW_OPENERS_EN.match(t_en):
        return True
    letters = re.findall(r"[^\W\d_]+", t_en)
    if letters and not cjk and all(w in _REPLY_WORDS for w in letters):
        return True  # "ok thanks", "yes please", "not really", "sí"
    words = _WORD.findall(t_en)
    if not words:
        return False
    if words[0] in _PRONOUN_LEAD_EN:
        return True
    return len(words) <= SHORT_EN_WORDS and any(w in _PRONOUNS_EN for w in words)


def may_cache_question(text: str) -> tuple[bool, str]:
    """Whether ``text`` may be a cache key (stored or looked up): ``(ok, reason)``.

    Reasons: ``"ok"``, ``"empty"``, ``"follow_up"``, or a personal-data kind from
    :func:`personal_data` (``"order_number"``, ``"email"``, ``"phone_number"``, ``"card_number"``,
    ``"street_address"``, ``"name"``).
    """
    if not text or not text.strip():
        return False, "empty"
    kind = personal_data(text)
    if kind:
        return False, kind
    if is_follow_up(text):
        return False, "follow_up"
    return True, "ok"


def may_cache_answer(text: str) -> tuple[bool, str]:
    """Whether an answer may be shared with other shoppers: ``(ok, reason)``.

    Refuses empty answers, answers that carry personal data (an answer that repeats the
    shopper's order number or e-mail address was made for that shopper only), answers that
    greet or thank someone by name (``"greets_by_name"``: "Thanks, Alice! Yes, we ship..."),
    and answers :func:`may_share_answer` refuses with the store's :func:`link_domains`
    (``"foreign_link"``, ``"iban"``, ``"payment_en"``...).
    """
    if not text or not text.strip():
        return False, "empty"
    kind = personal_data(text)
    if kind:
        return False, kind
    ok, reason = may_share_answer(text, link_domains())
    if not ok:
        return False, reason
    t = unicodedata.normalize("NFKC", text)
    for m in _GREETED_BY_NAME.finditer(t):
        if m.group(1)[0].isupper():  # IGNORECASE covers the greeting; the name stays capitalised
            return False, "greets_by_name"
    return True, "ok"
