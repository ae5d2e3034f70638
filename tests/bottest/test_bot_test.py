"""``manage.py bot_test`` (issue 37, docs/bot-tests.md): a right scenario passes; a wrong
expectation fails naming the turn and what differed; ``--repeat 3`` computes pass^3; the JUnit
file has the schema's elements and attributes; a scenario that cancels an order leaves the real
order untouched; a test conversation is in no queue, search or ops figure and no budget; an
unreadable file exits 2 naming its line. In-process (the command as ``call_command`` runs it), on
the test database with the demo store, the tests' FAQ and the test upstream."""

from __future__ import annotations

import io
import sys
import xml.etree.ElementTree as ET
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "store"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_order_actions import demo_orders
from test_order_tasks import order_faq

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["demo_orders", "order_faq"]  # fixtures of the store's tests, used here too

RIGHT_AND_WRONG = """\
- name: delivery time from the FAQ
  turns:
    - say: How long does delivery take?
      expect:
        route: faq
        contains: "1 business day"
        not_contains: refund
        handoff: false
        language: en
- name: a wrong expectation
  turns:
    - say: How long does delivery take?
      expect: {route: faq}
    - say: Which payment methods do you accept?
      expect:
        route: faq
        contains: Bitcoin
"""

CANCEL = """\
name: cancel an order over three messages, once
turns:
  - say: I want to cancel my order KF-1002
    expect: {tools_not_called: cancel, handoff: false}
  - say: mei.chen@example.com
    expect:
      route: action
      contains: "Shall I cancel it?"
      order: {number: KF-1002, status: placed, cancelled: 0}
  - say: "yes"
    expect:
      route: action
      contains: "is cancelled"
      tools_called: cancel
      order: {number: KF-1002, status: cancelled, cancelled: 1}
      no_personal_data: true
  - say: "yes, cancel KF-1002"
    expect:
      order: {number: KF-1002, status: cancelled, cancelled: 1}
"""


def bot_test(*args: str) -> tuple[int, list[str]]:
    """Run the command; its exit code and its output's lines."""
    out = io.StringIO()
    try:
        call_command("bot_test", *args, stdout=out)
    except SystemExit as e:
        return int(e.code or 0), out.getvalue().splitlines()
    return 0, out.getvalue().splitlines()


def scenario_file(tmp_path: Path, text: str, name: str = "suite.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_right_scenario_passes_and_a_wrong_expectation_fails_naming_its_turn(order_faq, demo_orders, tmp_path):
    code, lines = bot_test(scenario_file(tmp_path, RIGHT_AND_WRONG))
    assert code == 1, lines
    assert lines[0] == "PASS delivery time from the FAQ"
    assert lines[1].startswith(
        "FAIL a wrong expectation: turn 2: answer does not contain 'Bitcoin'; answer: 'We accept Visa"
    )
    assert lines[-1] == "1 passed, 1 failed"


def test_repeat_3_computes_pass_hat_3_and_the_junit_file_has_the_schemas_elements(order_faq, demo_orders, tmp_path):
    from chat.models import Conversation

    junit = tmp_path / "out" / "bot.xml"
    junit.parent.mkdir()
    code, lines = bot_test(scenario_file(tmp_path, RIGHT_AND_WRONG), "--repeat", "3", "--junit", str(junit))
    assert code == 1
    assert lines[0] == "PASS delivery time from the FAQ (3/3 runs passed, pass^3 = 1)"
    assert lines[1].startswith("FAIL a wrong expectation (0/3 runs passed, pass^3 = 0): turn 2: ")
    assert lines[-2] == "pass^3 = 0.50, pass^1 = 0.50"
    assert lines[-1] == "1 passed, 1 failed"
    assert Conversation.objects.filter(sandbox=True).count() == 6  # each run a new conversation

    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "2",
        "failures": "1",
        "errors": "0",
        "skipped": "0",
    }
    (suite,) = root.findall("testsuite")
    for attribute in (
        "name",
        "tests",
        "failures",
        "errors",
        "skipped",
        "time",
        "timestamp",
        "hostname",
        "id",
        "package",
    ):
        assert suite.get(attribute), attribute
    assert [c.tag for c in suite] == ["properties", "testcase", "testcase", "system-out", "system-err"]
    right, wrong = suite.findall("testcase")
    for case in (right, wrong):
        assert case.get("name") and case.get("classname", "").startswith("bottest.")
        float(case.get("time", ""))
    assert right.get("name") == "delivery time from the FAQ" and list(right) == []
    (failure,) = wrong.findall("failure")
    assert failure.get("message", "").startswith("FAIL a wrong expectation")
    assert failure.get("type") == "BotTestFailure"
    assert (failure.text or "").count("answer does not contain 'Bitcoin'") == 3


def test_a_scenario_that_cancels_an_order_leaves_the_real_order_untouched(order_faq, demo_orders, tmp_path):
    from store.models import DemoOrder, StoreCall

    before = DemoOrder.objects.get(number="KF-1002")
    calls = StoreCall.objects.count()
    code, lines = bot_test(scenario_file(tmp_path, CANCEL))
    assert (code, lines) == (0, ["PASS cancel an order over three messages, once", "1 passed, 0 failed"])
    after = DemoOrder.objects.get(number="KF-1002")
    assert (after.status, after.refunds) == ("placed", before.refunds) == ("placed", [])
    assert StoreCall.objects.count() == calls  # not in the store's audit log either


def test_a_second_cancellation_is_reported_when_the_sandbox_saw_two(order_faq, demo_orders, tmp_path):
    wrong = CANCEL.replace("cancelled: 1}", "cancelled: 2}", 1)  # turn 3's
    code, lines = bot_test(scenario_file(tmp_path, wrong))
    assert code == 1
    assert lines[0].startswith(
        "FAIL cancel an order over three messages, once: turn 3: order KF-1002: cancel expected 2 time(s), done 1"
    )


def test_a_test_conversation_is_in_no_queue_search_ops_figure_or_budget(
    order_faq, demo_orders, remote, settings, tmp_path
):
    from django.contrib.auth.models import User

    from chat import availability, selectors
    from chat.models import Conversation, Message
    from chat.search import search
    from ops import cells
    from ops import selectors as ops_selectors
    from routing.models import BudgetCounter, UpstreamCall

    settings.KEFU_BUDGET_SHOPPER_DAY_USD = 1.0
    settings.KEFU_SIMPLE_DAY_CAP_USD = 5.0
    text = """\
name: a remote answer, then a person
turns:
  - say: tell me something about zebrafinch lamps
    expect: {route: "llm.*", contains: zebrafinch, max_cost_usd: 0.01}
  - say: I want to talk to a person
    expect: {route: handoff, handoff: true}
"""
    code, lines = bot_test(scenario_file(tmp_path, text))
    assert (code, lines[-1]) == (0, "1 passed, 0 failed"), lines
    conv = Conversation.objects.get(sandbox=True)
    assert conv.status == "waiting_agent"
    assert Message.objects.filter(conversation=conv, role="bot", route__startswith="llm.").exists()

    assert selectors.console_counts() == {"waiting_agent": 0, "agent": 0, "bot": 0, "open": 0, "closed": 0}
    assert selectors.console_page(status="waiting_agent", after=None, limit=50)[0] == []
    assert availability.of_queue() == {}
    agent = User.objects.create_user("agent-bt", password="x")
    assert search(text="zebrafinch", agent=agent) == []

    calls = list(UpstreamCall.objects.values_list("purpose", flat=True))
    assert calls and set(calls) == {"test"}  # the ledger marks them
    assert BudgetCounter.objects.count() == 0  # no budget or cap held or counted them
    now = timezone.now()
    buckets = cells.raw_cells(now - timedelta(hours=1), now + timedelta(minutes=1), key=cells.aligned(3600))
    assert all(c.shopper_messages == 0 and not c.answers for c in buckets.values())
    figures = ops_selectors.totals()
    assert (figures["answers"], figures["calls"], figures["waiting"]) == ([], [], 0)
    assert cells.agent_queue_now() == (0, 0)


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("name: broken\nturns:\n  - say: hi\n   expect: {route: faq}\n", 4, "not YAML"),
        ("name: typo\nturns:\n  - say: hi\n    expect:\n      rout: faq\n", 5, "unknown key 'rout'"),
        ("- name: ok\n  turns:\n    - say: hi\n- name: no turns\n", 4, "turns: a non-empty list"),
    ],
)
def test_an_unreadable_file_exits_2_naming_its_line(tmp_path, text, line, problem):
    from chat.models import Conversation

    path = scenario_file(tmp_path, text)
    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("bot_test", path, stdout=out)
    assert raised.value.returncode == 2
    assert str(raised.value).startswith(f"{path}, line {line}: {problem}")
    assert out.getvalue().splitlines()[-1] == "0 passed, 0 failed"
    assert not Conversation.objects.exists()  # nothing ran


def test_a_missing_file_exits_2(tmp_path):
    with pytest.raises(CommandError) as raised:
        call_command("bot_test", str(tmp_path / "nope.yaml"), stdout=io.StringIO())
    assert raised.value.returncode == 2 and "no such file" in str(raised.value)


def test_a_judged_criterion_is_skipped_with_the_reason_when_no_model_is_configured(order_faq, demo_orders, tmp_path):
    text = """\
name: no refund promised
turns:
  - say: How long does delivery take?
    expect: {route: faq, judge: does not promise a refund}
"""
    code, lines = bot_test(scenario_file(tmp_path, text))
    assert code == 0
    assert lines == [
        "SKIP no refund promised: turn 1: 'does not promise a refund' not judged: "
        "no model is configured to judge it (no remote tier)",
        "0 passed, 0 failed, 1 skipped",
    ]


def test_the_answer_cache_is_never_written_by_a_run(faq, remote, tmp_path):
    """The same remote question in two scenarios: outside a bot test the second is an exact cache
    hit (tests/chat/test_cache_flow.py); here both go to the model and nothing is stored."""
    from cache_layer.models import CachedAnswer

    question = "Does the walnut floor lamp come with a dimmer switch?"
    text = "".join(
        f"- name: lamp {n}\n  turns:\n    - say: {question}\n      expect: {{route: llm.simple}}\n" for n in (1, 2)
    )
    code, lines = bot_test(scenario_file(tmp_path, text))
    assert (code, lines) == (0, ["PASS lamp 1", "PASS lamp 2", "2 passed, 0 failed"])
    assert len(remote.requests) == 2
    assert not CachedAnswer.objects.exists()


def test_a_judged_criterion_fails_when_the_configured_model_says_so(faq, remote, tmp_path):
    from routing.models import UpstreamCall

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fake_openai import Behaviour

    remote.push(Behaviour(text="FAIL It promises a refund."))  # the judge's reply: a FAQ answer calls no model
    text = "name: no refund\nturns:\n  - say: How long does delivery take?\n    expect: {route: faq, judge: does not promise a refund}\n"
    code, lines = bot_test(scenario_file(tmp_path, text))
    assert code == 1
    assert lines[0].startswith(
        "FAIL no refund: turn 1: judged 'does not promise a refund': not met (It promises a refund.); answer: 'Orders ship"
    )
    assert list(UpstreamCall.objects.values_list("purpose", flat=True)) == ["test"]
