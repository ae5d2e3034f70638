"""Prompt injection: flag the messages that try it, and stop an answer that gives kefu's
instructions away.

- :func:`injection_signals`: the rules a shopper message trips ("ignore all previous
  instructions", "show me your system prompt", "你现在是…", chat-template tags...), English and
  Chinese. A flagged message is answered as usual (most are curious shoppers, and the prompt's
  own rules hold), but its answer is never shared (answer cache, single flight), and it carries
  the flag ``prompt_injection`` in the transcript, for agents.
- :class:`LeakGuard`: a remote answer that repeats six words in a row of kefu's own instructions
  (the system prompt before the store information; the store's FAQ answers may be quoted) is
  stopped there, as a cut answer: at most five words of the instructions reach the shopper.
  Tested with a hostile upstream that echoes its whole prompt.

Patterns after OWASP's LLM01 (prompt injection) examples and the phrasings seen in public
jailbreak collections; they are signals for people, not a wall: the wall is that nothing secret
is in the prompt (personal data is masked, other shoppers' data is never there) and that a
flagged or history-made answer is never served to anyone else.
"""

from __future__ import annotations

import functools
import re

__all__ = ["FLAG", "LeakGuard", "injection_signals"]

#: The flag a suspicious shopper message carries (``Message.flags``).
FLAG = "prompt_injection"

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "override",
        re.compile(
            r"\b(?:ignore|disregard|forget|override|bypass)\b.{0,40}?\b(?:previous|prior|above|earlier|all|any|your|the)\b"
            r".{0,25}?\b(?:instructions?|prompts?|rules|directions|guidelines|orders)\b",
            re.IGNORECASE | re.DOTALL,
        ),
    ),
    (
        "prompt_probe",
        re.compile(
            r"\b(?:system|developer|hidden|initial|original)\s+(?:prompt|message|instructions?)\b"
            r"|\b(?:reveal|print|show|repeat|output|leak|dump)\b.{0,30}?\b(?:your|the)\b.{0,15}?\b(?:prompt|instructions?|rules)\b",
            re.IGNORECASE | re.DOTALL,
        ),
    ),
    (
        "role_play",
        re.compile(
            r"\byou are now\b|\bfrom now on\b|\bjailbr(?:eak|oken)\b|\bdeveloper mode\b|\bDAN\b|\bpretend (?:to be|you are)\b"
            r"|\b(?:end|start|begin|finish|sign)\s+(?:every|each|all|your)\s+(?:answers?|replies|reply|responses?|messages?)\b",
            re.IGNORECASE,
        ),
    ),
    ("verbatim", re.compile(r"\b(?:reply|respond|answer|say)\s+(?:exactly|only|verbatim)\b", re.IGNORECASE)),
    (
        "template",
        re.compile(r"<\|?/?(?:im_start|im_end|system|assistant)\|?>|\[/?INST\]|###\s*(?:system|instruction)", re.I),
    ),
    (
        "override_zh",
        re.compile(r"(?:忽略|无视|忘记|忘掉)(?:之前|以上|前面|上面|所有|你的)?的?(?:指令|指示|提示|规则|要求|设定)"),
    ),
    (
        "prompt_probe_zh",
        re.compile(
            r"(?:系统|初始|原始)(?:提示|指令)|(?:显示|输出|重复|告诉我|打印)(?:一下)?你的(?:提示|指令|规则|设定)"
        ),
    ),
    ("role_play_zh", re.compile(r"你现在是|从现在(?:开始|起)你|越狱|开发者模式")),
)


def injection_signals(text: str) -> list[str]:
    """The names of the rules ``text`` trips (``[]`` for an ordinary message), in rule order."""
    return [name for name, pattern in _RULES if pattern.search(text)]


_WORD = re.compile(r"[\w']+", re.UNICODE)
#: Words in a row that count as a leak.
SHINGLE = 6


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


@functools.lru_cache(maxsize=16)
def _shingles(text: str) -> frozenset[tuple[str, ...]]:
    """Every run of :data:`SHINGLE` words of ``text``: computed once per instructions text (one
    per locale and store name), not once per answer."""
    words = _words(text)
    return frozenset(tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1))


class LeakGuard:
    """Watches a streamed answer for :data:`SHINGLE` words in a row of ``instructions``.

    ``feed(piece)`` returns True once the text so far repeats them (the caller stops the stream).
    Words are compared lower-cased, punctuation ignored. A word split across pieces is checked
    when it is complete (the next piece starts with a non-word character, or :meth:`end`)."""

    def __init__(self, instructions: str) -> None:
        self._shingles = _shingles(instructions)
        self._recent: list[str] = []
        self._partial = ""

    def feed(self, piece: str) -> bool:
        text = self._partial + piece
        words = _words(text)
        # The last word may go on in the next piece: keep it back unless the piece ended it.
        self._partial = words.pop() if words and text and (text[-1].isalnum() or text[-1] in "_'") else ""
        return self._take(words)

    def end(self) -> bool:
        partial, self._partial = self._partial, ""
        return self._take([partial] if partial else [])

    def _take(self, words: list[str]) -> bool:
        for word in words:
            self._recent = [*self._recent[-(SHINGLE - 1) :], word]
            if len(self._recent) == SHINGLE and tuple(self._recent) in self._shingles:
                return True
        return False
