"""Runs scenarios (``bottest.scenarios``) in-process, each run a new sandboxed conversation
(``chat.sandbox`` inside ``lib.sandbox``), checks every turn's expectations, and reports: one line
per scenario, JUnit XML, and the contract's last line (docs/bot-tests.md).

A scenario passes when every run of it passed (``--repeat K``: pass^K, the share of scenarios
that pass K runs out of K, is the suite's figure; pass^1 is the share of all runs that passed).
A run fails at its first turn whose answer differs from what is expected (the turn's number and
what differed are reported); a run whose checks all held but whose judged criterion could not be
judged (no model configured) is skipped, with the reason.
"""

from __future__ import annotations

import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from channels.db import database_sync_to_async

from chat import sandbox as chat_sandbox
from lib import sandbox
from lib.text import detect_language, language_code
from routing import services as router
from store import services as store

from .scenarios import Expect, Scenario

#: An answer is quoted in a failure up to this many characters.
QUOTE_CHARS = 200

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# A phone number: 7 to 15 digits, possibly with +, spaces, dots, dashes or brackets between, not
# part of a longer word (a tracking number "JD0146..." or an order number "KF-1001" is not one).
_PHONE = re.compile(r"(?<![\w+-])\+?\d[\d ().-]{5,18}\d(?![\w-])")


@dataclass(frozen=True)
class RunResult:
    """One run of a scenario: ``status`` ``pass``/``fail``/``skip``; ``detail`` what differed
    (``"turn N: ..."``) or why it was skipped ("" for a pass); ``seconds`` it took; ``cost_usd``
    its answers cost; ``transcript`` a simulated shopper's conversation, ``(speaker, text)``."""

    status: str
    detail: str
    seconds: float
    cost_usd: Decimal
    transcript: tuple[tuple[str, str], ...] = ()  # a simulated shopper's: (shopper|assistant, text)


@dataclass
class ScenarioResult:
    """Every run of one scenario."""

    scenario: Scenario
    runs: list[RunResult] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``fail`` when a run failed, else ``skip`` when one was skipped, else ``pass``."""
        statuses = {r.status for r in self.runs}
        return "fail" if "fail" in statuses else "skip" if "skip" in statuses else "pass"

    @property
    def passed_runs(self) -> int:
        return sum(r.status == "pass" for r in self.runs)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs)

    def line(self, repeat: int) -> str:
        """The scenario's report line: ``PASS name``, ``FAIL name: turn N: ...``, ``SKIP name: why``;
        with ``repeat`` > 1 the runs that passed and pass^K."""
        status = self.status
        head = f"{status.upper()} {self.scenario.name}"
        if repeat > 1:
            head += f" ({self.passed_runs}/{len(self.runs)} runs passed, pass^{repeat} = {int(self.passed_runs == len(self.runs))})"
        detail = next((r.detail for r in self.runs if r.status == status and r.detail), "")
        return f"{head}: {detail}" if detail else head


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    if not flat:
        return "(no answer)"
    return repr(flat if len(flat) <= QUOTE_CHARS else flat[:QUOTE_CHARS] + "…")


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def _foreign_personal_data(answer: str, said: Sequence[str]) -> list[str]:
    """E-mail addresses and phone numbers in ``answer`` that the shopper did not write (``said``),
    masked for the report."""
    own = " ".join(said).casefold()
    own_digits = {_digits(m) for s in said for m in _PHONE.findall(s)}
    found = [e for e in _EMAIL.findall(answer) if e.casefold() not in own]
    found += [p for p in _PHONE.findall(answer) if 7 <= len(_digits(p)) <= 15 and _digits(p) not in own_digits]
    return [f[:2] + "***" + f[-2:] for f in found]


def check_turn(
    expect: Expect,
    turn: chat_sandbox.Turn,
    *,
    calls: Sequence[dict[str, Any]],
    said: Sequence[str],
    peek: Callable[[str], Any] | None = None,
    writes: Callable[[str, str], int] | None = None,
) -> list[str]:
    """What differs between ``turn`` (an answer) and ``expect``, one phrase each ([] when all
    held; judged criteria are not checked here). ``calls``: the store calls made for it (the
    sandbox's ``calls``); ``said``: what the shopper wrote so far in the scenario; ``peek``: an
    order number -> the order as the sandbox sees it (None: no such order); ``writes``: (action,
    number) -> the sandbox's changes of it so far. Blocking (``peek`` reads the store)."""
    problems: list[str] = []
    text = turn.text
    folded = text.casefold()
    if expect.route and not any(fnmatchcase(turn.route, p) for p in expect.route):
        problems.append(f"route: expected {' or '.join(expect.route)}, got {turn.route or '(no answer)'}")
    missing = [s for s in expect.contains if s.casefold() not in folded]
    if missing:
        problems.append("answer does not contain " + ", ".join(repr(s) for s in missing))
    present = [s for s in expect.not_contains if s.casefold() in folded]
    if present:
        problems.append("answer contains " + ", ".join(repr(s) for s in present))
    if expect.handoff is not None and turn.handoff != expect.handoff:
        problems.append(
            f"handoff: expected {str(expect.handoff).lower()}, got {str(turn.handoff).lower()} (status {turn.status})"
        )
    if expect.language is not None:
        got = detect_language(text, turn.locale).locale if text.strip() else "(no answer)"
        if language_code(got) != language_code(expect.language):
            problems.append(f"language: expected {expect.language}, got {got}")
    called = {c["action"] for c in calls}
    absent = [t for t in expect.tools_called if t not in called]
    if absent:
        problems.append(f"tools_called: {', '.join(absent)} not called (called: {', '.join(sorted(called)) or 'none'})")
    made = [t for t in expect.tools_not_called if t in called]
    if made:
        problems.append(f"tools_not_called: {', '.join(made)} was called")
    if expect.order is not None and peek is not None and writes is not None:
        order = peek(expect.order.number)
        if order is None:
            problems.append(f"order {expect.order.number}: no such order in the store")
        else:
            if expect.order.status is not None and order.status != expect.order.status:
                problems.append(f"order {order.number}: status expected {expect.order.status}, got {order.status}")
            for action, n in expect.order.changes.items():
                done = writes(action, order.number)
                if done != n:
                    problems.append(f"order {order.number}: {action} expected {n} time(s), done {done}")
    if expect.no_personal_data:
        foreign = _foreign_personal_data(text, said)
        if foreign:
            problems.append(f"personal data the shopper did not give: {', '.join(foreign)}")
    if expect.max_cost_usd is not None and turn.cost_usd > expect.max_cost_usd:
        problems.append(f"cost: {turn.cost_usd:f} USD, over the ceiling of {expect.max_cost_usd:f}")
    if problems:
        problems.append(f"answer: {_quote(text)}")
    return problems


async def run_once(scenario: Scenario) -> RunResult:
    """One run of ``scenario``: a new sandboxed conversation, its turns in order, stopping at the
    first that fails. Raises only what the database raises."""
    started = time.perf_counter()
    total = Decimal(0)
    skipped: list[str] = []

    def result(status: str, detail: str) -> RunResult:
        return RunResult(status=status, detail=detail, seconds=time.perf_counter() - started, cost_usd=total)

    with sandbox.entered() as box:
        cid = await database_sync_to_async(chat_sandbox.conversation_start)(locale=scenario.locale)
        said: list[str] = []
        for n, spec in enumerate(scenario.turns, 1):
            before = len(box.calls)
            turn = await chat_sandbox.turn(conversation_id=cid, text=spec.say)
            said.append(spec.say)
            total += turn.cost_usd
            problems = await database_sync_to_async(check_turn)(
                spec.expect,
                turn,
                calls=box.calls[before:],
                said=said,
                peek=store.order_peek,
                writes=lambda action, number: len(box.writes_of(action, number)),
            )
            if problems:
                return result("fail", f"turn {n}: " + "; ".join(problems))
            for criterion in spec.expect.judge:
                judged = await router.answer_judge(criterion=criterion, question=spec.say, answer=turn.text)
                await router.router_drain()  # its ledger row is written before the run's loop ends
                if judged.passed is None:
                    skipped.append(f"turn {n}: {criterion!r} not judged: {judged.reason}")
                elif not judged.passed:
                    why = f" ({judged.reason})" if judged.reason else ""
                    return result("fail", f"turn {n}: judged {criterion!r}: not met{why}; answer: {_quote(turn.text)}")
        if scenario.max_cost_usd is not None and total > scenario.max_cost_usd:
            return result(
                "fail",
                f"turn {len(scenario.turns)}: cost: {total:f} USD in all, over the ceiling of {scenario.max_cost_usd:f}",
            )
    if skipped:
        return result("skip", "; ".join(skipped))
    return result("pass", "")


_OUTCOME_WORDS = {"reached": "goal reached", "gave_up": "gave up", "turn_limit": "turn limit hit"}


def _conversation(turn: chat_sandbox.Turn, *, turns: Sequence[chat_sandbox.Turn]) -> chat_sandbox.Turn:
    """A simulated shopper's whole conversation as one answer, checked as a turn is: every answer's
    text joined, the last answer's route (and its locale), the conversation's status at the end,
    what all answers cost."""
    answered = [t for t in turns if t.text]
    return chat_sandbox.Turn(
        seq=turn.seq,
        text="\n\n".join(t.text for t in answered),
        route=turn.route,
        routes=tuple(r for t in turns for r in t.routes),
        notices=tuple(n for t in turns for n in t.notices),
        status=turn.status,
        locale=turn.locale,
        cost_usd=sum((t.cost_usd for t in turns), Decimal(0)),
    )


async def run_simulated(scenario: Scenario, *, conversations: list[Any] | None = None) -> RunResult:
    """One run of a simulated shopper's ``scenario``: a model (``routing.services.shopper_say``)
    plays its persona in a new sandboxed conversation until it says its goal is reached or gave up,
    or it sent ``max_turns`` messages (then it is asked once more whether the goal was reached);
    then the conversation is checked against the scenario's ``expect`` and ``outcome``. Skipped
    when no model plays the shopper (or its call failed). ``conversations`` gets the run's
    conversation id (for the ledger's figures)."""
    started = time.perf_counter()
    turns: list[chat_sandbox.Turn] = []
    transcript: list[tuple[str, str]] = []

    def result(status: str, detail: str) -> RunResult:
        cost = sum((t.cost_usd for t in turns), Decimal(0))
        return RunResult(status, detail, time.perf_counter() - started, cost, tuple(transcript))

    with sandbox.entered() as box:
        cid = await database_sync_to_async(chat_sandbox.conversation_start)(locale=scenario.locale)
        if conversations is not None:
            conversations.append(cid)
        outcome = "turn_limit"
        for n in range(scenario.max_turns + 1):
            line = await router.shopper_say(
                persona=scenario.persona,
                goal=scenario.goal,
                knows=scenario.knows,
                locale=scenario.locale,
                transcript=transcript,
                conversation_id=cid,
            )
            await router.router_drain()  # its ledger row is written before the run's loop ends
            if line.error:
                return result("skip", f"turn {n + 1}: {line.error}")
            if line.outcome:
                if line.text:
                    transcript.append(("shopper", line.text))  # said on leaving; not sent
                outcome = line.outcome
                break
            if n == scenario.max_turns:
                break  # it would go on: the turn limit
            turn = await chat_sandbox.turn(conversation_id=cid, text=line.text)
            transcript += [("shopper", line.text), ("assistant", turn.text)]
            turns.append(turn)
        said = [text for who, text in transcript if who == "shopper"]
        ended = f"{_OUTCOME_WORDS[outcome]} after {len(turns)} turn{'s' * (len(turns) != 1)}"
        last = turns[-1] if turns else None
        if scenario.outcome not in ("any", outcome):
            answer = f"; last answer: {_quote(last.text)}" if last else ""
            return result("fail", f"{ended}: expected {_OUTCOME_WORDS[scenario.outcome]}{answer}")
        if last is None:
            return result("fail", f"{ended}: the shopper sent no message")
        whole = _conversation(last, turns=turns)
        problems = await database_sync_to_async(check_turn)(
            scenario.expect,
            whole,
            calls=box.calls,
            said=said,
            peek=store.order_peek,
            writes=lambda action, number: len(box.writes_of(action, number)),
        )
        if problems:
            return result("fail", f"{ended}: " + "; ".join(problems))
        skipped = []
        for criterion in scenario.expect.judge:
            judged = await router.answer_judge(
                criterion=criterion, question=said[0], answer=last.text, transcript=transcript
            )
            await router.router_drain()
            if judged.passed is None:
                skipped.append(f"{ended}: {criterion!r} not judged: {judged.reason}")
            elif not judged.passed:
                why = f" ({judged.reason})" if judged.reason else ""
                return result("fail", f"{ended}: judged {criterion!r}: not met{why}")
        if scenario.max_cost_usd is not None and whole.cost_usd > scenario.max_cost_usd:
            return result(
                "fail", f"{ended}: cost: {whole.cost_usd:f} USD in all, over the ceiling of {scenario.max_cost_usd:f}"
            )
    if skipped:
        return result("skip", "; ".join(skipped))
    return result("pass", ended)


async def cost_estimate(scenarios: Sequence[Scenario], *, repeat: int = 1) -> str | None:
    """The line a run shows before it starts when it has simulated shoppers: the most their model
    calls may cost (``routing.services.shopper_estimate``, for every run), e.g. ``COST estimate:
    up to 0.012 USD for 2 simulated shopper runs (tier simple, model gpt-4o-mini)``; None when
    ``scenarios`` have none or no model plays them (they are skipped)."""
    simulated = [s for s in scenarios if s.simulated]
    total = Decimal(0)
    est = None
    for s in simulated:
        est = await router.shopper_estimate(persona=s.persona, goal=s.goal, knows=s.knows, max_turns=s.max_turns)
        if est is None:
            return None
        total += est.usd * repeat
    if est is None:
        return None
    runs = len(simulated) * repeat
    return (
        f"COST estimate: up to {total:f} USD for {runs} simulated shopper run{'s' * (runs != 1)} "
        f"(tier {est.tier}, model {est.model})"
    )


async def run(
    scenarios: Sequence[Scenario], *, repeat: int = 1, report: Callable[[str], None] = print
) -> list[ScenarioResult]:
    """Run every scenario ``repeat`` times, in order; ``report`` gets each scenario's line as it
    ends. With simulated shoppers, ``report`` first gets the cost estimate (``cost_estimate``)
    and last what the ledger holds for their conversations (``COST spent: X USD by the simulated
    shoppers, Y USD by the bot's answers (ledger, purpose test)``); without a model such
    scenarios are skipped with the reason. Returns the results."""
    await chat_sandbox.ready()
    estimate = await cost_estimate(scenarios, repeat=repeat)
    if estimate:
        report(estimate)
    results = []
    conversations: list[Any] = []
    for scenario in scenarios:
        res = ScenarioResult(scenario)
        for _ in range(repeat):
            if scenario.simulated and estimate is None:
                res.runs.append(
                    RunResult("skip", "no model is configured to play the shopper (no remote tier)", 0.0, Decimal(0))
                )
            elif scenario.simulated:
                res.runs.append(await run_simulated(scenario, conversations=conversations))
            else:
                res.runs.append(await run_once(scenario))
        results.append(res)
        report(res.line(repeat))
    if estimate:
        spent = await database_sync_to_async(router.test_spend_usd)(conversation_ids=conversations)
        report(
            f"COST spent: {spent['shopper']:f} USD by the simulated shoppers, "
            f"{spent['answers']:f} USD by the bot's answers (ledger, purpose test)"
        )
    return results


def totals(results: Sequence[ScenarioResult]) -> tuple[int, int, int]:
    """``(passed, failed, skipped)`` scenarios."""
    statuses = [r.status for r in results]
    return statuses.count("pass"), statuses.count("fail"), statuses.count("skip")


def pass_hat(results: Sequence[ScenarioResult], k: int) -> float | None:
    """pass^k over the scenarios not skipped: the share whose k runs all passed (None: none)."""
    judged = [r for r in results if r.status != "skip"]
    if not judged:
        return None
    return sum(r.passed_runs == len(r.runs) == k for r in judged) / len(judged)


def summary_line(results: Sequence[ScenarioResult]) -> str:
    """The contract's last line: ``N passed, M failed`` and ``, S skipped`` when some were."""
    passed, failed, skipped = totals(results)
    return f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")


def junit_xml(results: Sequence[ScenarioResult], *, repeat: int = 1) -> ET.ElementTree:
    """The results as JUnit XML: ``<testsuites>`` holding one ``<testsuite>`` per scenario file
    (name, tests, failures, errors, skipped, time, timestamp, hostname; ``<properties>``,
    ``<system-out>``, ``<system-err>``) and one ``<testcase>`` per scenario (name, classname, time)
    with a ``<failure>`` or ``<skipped>`` element when it did not pass."""
    root = ET.Element("testsuites", name="bot_test")
    by_file: dict[str, list[ScenarioResult]] = {}
    for r in results:
        by_file.setdefault(r.scenario.path, []).append(r)
    stamp = datetime.now(UTC).replace(microsecond=0, tzinfo=None).isoformat()
    host = socket.gethostname() or "localhost"
    for i, (path, rs) in enumerate(by_file.items()):
        _, failed, skipped = totals(rs)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=path,
            id=str(i),
            package="bottest",
            tests=str(len(rs)),
            failures=str(failed),
            errors="0",
            skipped=str(skipped),
            time=f"{sum(r.seconds for r in rs):.3f}",
            timestamp=stamp,
            hostname=host,
        )
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="repeat", value=str(repeat))
        classname = "bottest." + re.sub(r"[^\w]+", "_", Path(path).with_suffix("").as_posix()).strip("_")
        for r in rs:
            case = ET.SubElement(suite, "testcase", name=r.scenario.name, classname=classname, time=f"{r.seconds:.3f}")
            details = "\n".join(
                f"run {j}: {run.status}: {run.detail}" + "".join(f"\n  {who}: {text}" for who, text in run.transcript)
                for j, run in enumerate(r.runs, 1)
                if run.detail
            )
            if r.status == "fail":
                fail = ET.SubElement(case, "failure", message=r.line(repeat), type="BotTestFailure")
                fail.text = details
            elif r.status == "skip":
                ET.SubElement(case, "skipped", message=r.line(repeat))
        ET.SubElement(suite, "system-out").text = "\n".join(r.line(repeat) for r in rs)
        ET.SubElement(suite, "system-err").text = ""
    _, failed, skipped = totals(results)
    root.set("tests", str(len(results)))
    root.set("failures", str(failed))
    root.set("errors", "0")
    root.set("skipped", str(skipped))
    root.set("time", f"{sum(r.seconds for r in results):.3f}")
    ET.indent(root)
    return ET.ElementTree(root)
