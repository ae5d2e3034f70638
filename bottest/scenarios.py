"""Scenario files (YAML): the format of ``../shared/CONTRACT.md`` ("Bot tests") and kefu's
additions (docs/bot-tests.md), read into frozen values, every error naming its file and line.

A file holds one scenario (a mapping) or a list of them::

    name: STR
    locale: en                  # optional: the conversation's language at the start
    max_cost_usd: 0.01          # optional: what all its answers may cost together (USD)
    turns:
      - say: STR
        expect:                 # optional; every key given must hold for the answer to this message
          route: STR | [STR]    # one of these (``llm.*`` matches every tier)
          contains: STR | [STR] # case-insensitive substrings of the answer
          not_contains: STR | [STR]
          handoff: BOOL         # the conversation now waits for a person
          language: STR         # the answer's language (ISO 639-1: en, zh, es...)
          tools_called: STR | [STR]      # store calls made for this message (status, cancel...)
          tools_not_called: STR | [STR]
          order: {number: STR, status: STR, cancelled: INT, returned: INT, address_changed: INT}
          no_personal_data: true         # no e-mail or phone number the shopper did not give
          max_cost_usd: NUMBER           # what this message's answers may cost (USD)
          judge: STR | [STR]             # criteria a model checks (skipped when none is configured)

Or, instead of ``turns``, a simulated shopper (a model plays it; skipped when none is configured)::

    persona: STR                # who the shopper is and how they write
    goal: STR                   # what they want done (required with persona)
    knows: {KEY: VALUE} | [STR] # optional: facts they can give (e-mail, order number...)
    max_turns: 8                # optional: the most messages they send (1 to 30)
    expect:                     # optional; checked once the conversation ended
      outcome: reached          # reached (default), gave_up, turn_limit or any
      ...                       # any key above: over the whole conversation (see docs/bot-tests.md)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

#: Keys of a scenario, a turn and an expectation.
SCENARIO_KEYS = {"name", "locale", "turns", "max_cost_usd", "persona", "goal", "knows", "max_turns", "expect"}
TURN_KEYS = {"say", "expect"}
EXPECT_KEYS = {
    "route",
    "contains",
    "not_contains",
    "handoff",
    "language",
    "tools_called",
    "tools_not_called",
    "order",
    "no_personal_data",
    "max_cost_usd",
    "judge",
}
#: How a simulated shopper's conversation may end (``expect.outcome``; ``any``: however it ends).
OUTCOMES = ("reached", "gave_up", "turn_limit", "any")
#: A simulated shopper's turn limit: the default and the most a scenario may set.
MAX_TURNS_DEFAULT = 8
MAX_TURNS_CAP = 30
ORDER_KEYS = {"number", "status", "cancelled", "returned", "address_changed"}
ORDER_COUNTS = {"cancelled": "cancel", "returned": "return", "address_changed": "change_address"}


class ScenarioError(Exception):
    """A scenario file that cannot be read: ``path``, ``line`` (1-based; 0 when the whole file is
    at fault) and what is wrong. ``str()`` is ``"PATH, line N: message"``."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path, self.line, self.message = path, line, message
        super().__init__(f"{path}, line {line}: {message}" if line else f"{path}: {message}")


@dataclass(frozen=True)
class OrderExpect:
    """The order ``number`` after the turn: its ``status`` (None: not checked) and how many times
    the sandbox changed it so far, by action (``{"cancel": 1}``)."""

    number: str
    status: str | None = None
    changes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Expect:
    """What the answer to one message must show (None / empty: not checked); see the module."""

    route: tuple[str, ...] = ()
    contains: tuple[str, ...] = ()
    not_contains: tuple[str, ...] = ()
    handoff: bool | None = None
    language: str | None = None
    tools_called: tuple[str, ...] = ()
    tools_not_called: tuple[str, ...] = ()
    order: OrderExpect | None = None
    no_personal_data: bool = False
    max_cost_usd: Decimal | None = None
    judge: tuple[str, ...] = ()


@dataclass(frozen=True)
class TurnSpec:
    """One shopper message (``say``) and what its answer must show; ``line`` in its file."""

    say: str
    expect: Expect
    line: int


@dataclass(frozen=True)
class Scenario:
    """One scenario: a new conversation in ``locale`` with its ``turns``; ``path`` and ``line``
    where it is written. A simulated shopper's scenario has no turns but a ``persona`` pursuing
    ``goal``, knowing the facts ``knows``, sending at most ``max_turns`` messages; ``expect`` is
    checked once its conversation ended, which must end as ``outcome`` (``OUTCOMES``)."""

    name: str
    turns: tuple[TurnSpec, ...]
    path: str
    line: int
    locale: str = "en"
    max_cost_usd: Decimal | None = None
    persona: str = ""
    goal: str = ""
    knows: tuple[str, ...] = ()
    max_turns: int = MAX_TURNS_DEFAULT
    expect: Expect = field(default_factory=Expect)
    outcome: str = "reached"

    @property
    def simulated(self) -> bool:
        """Whether a model plays the shopper (a persona and a goal instead of turns)."""
        return bool(self.persona)


class _Loader(yaml.SafeLoader):
    """Safe YAML whose mappings remember their line and their keys' lines."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping: dict[Any, Any] = {}
    lines: dict[Any, int] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        mapping[key] = loader.construct_object(value_node, deep=True)
        lines[key] = key_node.start_mark.line + 1
    return _Mapping(mapping, line=node.start_mark.line + 1, lines=lines)


class _Mapping(dict[Any, Any]):
    def __init__(self, data: dict[Any, Any], *, line: int, lines: dict[Any, int]) -> None:
        super().__init__(data)
        self.line = line
        self.lines = lines

    def line_of(self, key: str) -> int:
        return self.lines.get(key, self.line)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _strings(value: Any, *, path: str, line: int, key: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, str) and v.strip() for v in items):
        raise ScenarioError(path, line, f"{key}: a non-empty string or a list of them")
    return tuple(items)


def _usd(value: Any, *, path: str, line: int, key: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ScenarioError(path, line, f"{key}: a number of USD")
    try:
        usd = Decimal(str(value))
    except InvalidOperation:
        raise ScenarioError(path, line, f"{key}: a number of USD") from None
    if not usd.is_finite() or usd < 0:
        raise ScenarioError(path, line, f"{key}: a number of USD, 0 or more")
    return usd


def _unknown(m: _Mapping, allowed: set[str], *, path: str, what: str) -> None:
    for key in m:
        if key not in allowed:
            raise ScenarioError(
                path, m.line_of(key), f"unknown key {key!r} in {what} (known: {', '.join(sorted(allowed))})"
            )


def _order(value: Any, *, path: str, line: int) -> OrderExpect:
    if not isinstance(value, _Mapping):
        raise ScenarioError(
            path, line, "order: a mapping with number and status, cancelled, returned or address_changed"
        )
    _unknown(value, ORDER_KEYS, path=path, what="order")
    number = value.get("number")
    if not isinstance(number, str | int) or isinstance(number, bool) or not str(number).strip():
        raise ScenarioError(path, value.line, "order: number is required (the order's number, e.g. KF-1002)")
    status = value.get("status")
    if status is not None and not isinstance(status, str):
        raise ScenarioError(path, value.line_of("status"), "order.status: a string (placed, cancelled...)")
    changes: dict[str, int] = {}
    for key, action in ORDER_COUNTS.items():
        if key in value:
            n = value[key]
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ScenarioError(path, value.line_of(key), f"order.{key}: a count, 0 or more")
            changes[action] = n
    return OrderExpect(number=str(number).strip(), status=status, changes=changes)


def _expect(value: Any, *, path: str, line: int, extra: frozenset[str] = frozenset()) -> Expect:
    if value is None:
        return Expect()
    if not isinstance(value, _Mapping):
        raise ScenarioError(path, line, "expect: a mapping (route, contains, not_contains, handoff...)")
    _unknown(value, EXPECT_KEYS | extra, path=path, what="expect")
    got: dict[str, Any] = {}
    for key in ("route", "contains", "not_contains", "tools_called", "tools_not_called", "judge"):
        if key in value:
            got[key] = _strings(value[key], path=path, line=value.line_of(key), key=key)
    for key in ("handoff", "no_personal_data"):
        if key in value:
            if not isinstance(value[key], bool):
                raise ScenarioError(path, value.line_of(key), f"{key}: true or false")
            got[key] = value[key]
    if "language" in value:
        if not isinstance(value["language"], str) or not value["language"].strip():
            raise ScenarioError(path, value.line_of("language"), "language: a language code (en, zh, es...)")
        got["language"] = value["language"].strip().lower()
    if "max_cost_usd" in value:
        got["max_cost_usd"] = _usd(
            value["max_cost_usd"], path=path, line=value.line_of("max_cost_usd"), key="max_cost_usd"
        )
    if "order" in value:
        got["order"] = _order(value["order"], path=path, line=value.line_of("order"))
    return Expect(**got)


def _scenario(value: Any, *, path: str, line: int) -> Scenario:
    if not isinstance(value, _Mapping):
        raise ScenarioError(path, line, "a scenario is a mapping with name and turns")
    _unknown(value, SCENARIO_KEYS, path=path, what="a scenario")
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(path, value.line_of("name"), "name: a non-empty string is required")
    locale = value.get("locale", "en")
    if not isinstance(locale, str) or not locale.strip():
        raise ScenarioError(path, value.line_of("locale"), "locale: a language code (en, zh...)")
    if "persona" in value or "goal" in value:
        return _simulated(value, name=name.strip(), locale=locale.strip(), path=path)
    for key in ("knows", "max_turns", "expect"):
        if key in value:
            raise ScenarioError(
                path,
                value.line_of(key),
                f"{key}: only with persona and goal (a simulated shopper); turns have their own",
            )
    turns = value.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ScenarioError(path, value.line_of("turns"), "turns: a non-empty list of {say, expect}")
    specs = []
    for i, t in enumerate(turns, 1):
        if not isinstance(t, _Mapping):
            raise ScenarioError(path, value.line_of("turns"), f"turn {i}: a mapping with say (and expect)")
        _unknown(t, TURN_KEYS, path=path, what=f"turn {i}")
        say = t.get("say")
        if not isinstance(say, str | int | float) or isinstance(say, bool) or not str(say).strip():
            raise ScenarioError(path, t.line_of("say"), f"turn {i}: say: what the shopper sends, a non-empty string")
        specs.append(
            TurnSpec(say=str(say), expect=_expect(t.get("expect"), path=path, line=t.line_of("expect")), line=t.line)
        )
    cost = value.get("max_cost_usd")
    return Scenario(
        name=name.strip(),
        turns=tuple(specs),
        path=path,
        line=value.line,
        locale=locale.strip(),
        max_cost_usd=None
        if cost is None
        else _usd(cost, path=path, line=value.line_of("max_cost_usd"), key="max_cost_usd"),
    )


def _text(value: Any, *, path: str, line: int, key: str, hint: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ScenarioError(path, line, f"{key}: a non-empty string ({hint})")
    return value.strip()


def _knows(value: Any, *, path: str, line: int) -> tuple[str, ...]:
    """``knows``: a mapping (``email: mei@example.com``, each read as "email: mei@example.com"),
    a list of strings or one string."""
    if isinstance(value, _Mapping):
        facts = []
        for key, fact in value.items():
            if not isinstance(fact, str | int | float) or isinstance(fact, bool) or not str(fact).strip():
                raise ScenarioError(path, value.line_of(key), f"knows.{key}: a fact, a non-empty string or number")
            facts.append(f"{key}: {fact}")
        if not facts:
            raise ScenarioError(path, line, "knows: facts the shopper can give, a mapping or a list of strings")
        return tuple(facts)
    return _strings(value, path=path, line=line, key="knows")


def _simulated(value: _Mapping, *, name: str, locale: str, path: str) -> Scenario:
    """A scenario whose shopper a model plays (``persona`` and ``goal`` instead of ``turns``)."""
    if "turns" in value:
        raise ScenarioError(
            path, value.line_of("turns"), "turns: not with persona and goal (a simulated shopper writes its own)"
        )
    if "persona" not in value:
        raise ScenarioError(path, value.line_of("goal"), "persona: required with goal (who the shopper is)")
    persona = _text(
        value["persona"], path=path, line=value.line_of("persona"), key="persona", hint="who the shopper is"
    )
    if "goal" not in value:
        raise ScenarioError(path, value.line_of("persona"), "goal: required with persona (what the shopper wants done)")
    goal = _text(value["goal"], path=path, line=value.line_of("goal"), key="goal", hint="what the shopper wants done")
    knows = _knows(value["knows"], path=path, line=value.line_of("knows")) if "knows" in value else ()
    max_turns = value.get("max_turns", MAX_TURNS_DEFAULT)
    if not isinstance(max_turns, int) or isinstance(max_turns, bool) or not 1 <= max_turns <= MAX_TURNS_CAP:
        raise ScenarioError(path, value.line_of("max_turns"), f"max_turns: a whole number from 1 to {MAX_TURNS_CAP}")
    raw = value.get("expect")
    outcome = "reached"
    if isinstance(raw, _Mapping) and "outcome" in raw:
        outcome = raw["outcome"]
        if outcome not in OUTCOMES:
            raise ScenarioError(path, raw.line_of("outcome"), f"outcome: one of {', '.join(OUTCOMES)}")
    expect = _expect(raw, path=path, line=value.line_of("expect"), extra=frozenset({"outcome"}))
    cost = value.get("max_cost_usd")
    return Scenario(
        name=name,
        turns=(),
        path=path,
        line=value.line,
        locale=locale,
        max_cost_usd=None
        if cost is None
        else _usd(cost, path=path, line=value.line_of("max_cost_usd"), key="max_cost_usd"),
        persona=persona,
        goal=goal,
        knows=knows,
        max_turns=max_turns,
        expect=expect,
        outcome=outcome,
    )


def parse(text: str, *, path: str) -> list[Scenario]:
    """The scenarios of one file's ``text`` (``path`` names it in errors).

    Raises:
        ScenarioError: not YAML, or not the format (the line of the first fault).
    """
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise ScenarioError(path, (mark.line + 1) if mark else 0, f"not YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(path, 0, f"not YAML: {e}") from None
    if data is None:
        raise ScenarioError(path, 1, "empty: a scenario or a list of scenarios is expected")
    if isinstance(data, list):
        if not data:
            raise ScenarioError(path, 1, "an empty list: at least one scenario is expected")
        return [_scenario(item, path=path, line=getattr(item, "line", 1)) for item in data]
    return [_scenario(data, path=path, line=getattr(data, "line", 1))]


def scenario_files(paths: list[str]) -> list[Path]:
    """The files ``paths`` name: a file as given, a directory's ``*.yaml``/``*.yml`` files
    (recursively, sorted).

    Raises:
        ScenarioError: a path that does not exist, or a directory with no scenario file.
    """
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(f for f in path.rglob("*") if f.suffix in (".yaml", ".yml") and f.is_file())
            if not found:
                raise ScenarioError(p, 0, "a directory with no .yaml or .yml file")
            out += found
        elif path.exists():
            out.append(path)
        else:
            raise ScenarioError(p, 0, "no such file or directory")
    return out


def load(paths: list[str]) -> list[Scenario]:
    """Every scenario of ``paths`` (files or directories), in order.

    Raises:
        ScenarioError: the first file that cannot be read, with its line.
    """
    scenarios: list[Scenario] = []
    for f in scenario_files(paths):
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            line = f.read_bytes()[: e.start].count(b"\n") + 1
            raise ScenarioError(str(f), line, "not UTF-8 text") from None
        except OSError as e:
            raise ScenarioError(str(f), 0, f"cannot be read: {e.strerror or e}") from None
        scenarios += parse(text, path=str(f))
    return scenarios
