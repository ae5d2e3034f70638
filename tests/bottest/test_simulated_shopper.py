"""A simulated shopper in ``manage.py bot_test`` (issue 38 item 1, docs/bot-tests.md): a scenario
with a persona and a goal instead of turns, a model playing the shopper. Driven by the test
upstream with the shopper's replies scripted (the bot's own answers here come from the FAQ and the
store, no model): a shopper that reaches its goal passes, one that gives up fails naming how it
ended, one that hits its turn limit is judged by ``outcome``; the shopper's calls are in the ledger
(purpose ``test``) in USD and the run shows the estimate before and the ledger's cost after.
Without a model such a scenario is skipped with the reason; a persona without a goal is a file
error naming its line. In-process, on the test database with the demo store and the tests' FAQ."""

from __future__ import annotations

import io
import re
import sys
import xml.etree.ElementTree as ET
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "store"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour
from test_order_actions import demo_orders
from test_order_tasks import order_faq

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["demo_orders", "order_faq"]  # fixtures of the store's tests, used here too

CANCEL = """\
- name: a shopper cancels an order knowing its number and e-mail
  persona: Mei, a busy customer who writes short messages.
  goal: Cancel your order KF-1002 before it ships.
  knows: {order: KF-1002, email: mei.chen@example.com}
  max_turns: 5
  expect:
    tools_called: cancel
    order: {number: KF-1002, status: cancelled, cancelled: 1}
    no_personal_data: true
"""

GIVES_UP = """\
- name: a shopper who gives up
  persona: Sam, impatient.
  goal: Learn how long delivery takes.
  expect: {route: faq}
"""

TURN_LIMIT = """\
- name: a shopper who never finishes
  persona: Lee, who keeps asking about delivery.
  goal: Learn every detail of delivery.
  max_turns: 2
  expect: {outcome: turn_limit, route: faq, contains: "1 business day"}
"""

FIXED = """\
- name: delivery time from the FAQ
  turns:
    - say: How long does delivery take?
      expect: {route: faq, contains: "1 business day"}
"""

# The simple tier's test prices (tests/conftest.py REMOTE_PRICES): 0.28 USD per million input
# tokens, 0.42 per million output tokens. A scripted reply reports 1000 + 20 tokens:
# 1000 * 0.28 / 1e6 + 20 * 0.42 / 1e6 = 0.0002884, 0.000288 on the ledger's 6 decimals.
CALL_USD = Decimal("0.000288")


def shopper(text: str) -> Behaviour:
    return Behaviour(text=text, prompt_tokens=1000, completion_tokens=20, include_usage=True)


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


def test_a_shopper_that_reaches_its_goal_passes_and_its_cost_is_in_the_ledger(order_faq, demo_orders, remote, tmp_path):
    from routing.models import UpstreamCall
    from store.models import DemoOrder

    remote.push(
        shopper("Hi, I want to cancel my order KF-1002"),
        shopper("mei.chen@example.com"),
        shopper("yes"),
        shopper("Thank you!\nGOAL_REACHED"),
    )
    junit = tmp_path / "bot.xml"
    code, lines = bot_test(scenario_file(tmp_path, CANCEL), "--junit", str(junit))
    assert code == 0, lines
    estimate = re.fullmatch(
        r"COST estimate: up to (\d+\.\d+) USD for 1 simulated shopper run \(tier simple, model fake-simple\)", lines[0]
    )
    assert estimate, lines
    assert lines[1:] == [
        "PASS a shopper cancels an order knowing its number and e-mail: goal reached after 3 turns",
        f"COST spent: {4 * CALL_USD:f} USD by the simulated shoppers, 0.000000 USD by the bot's answers "
        "(ledger, purpose test)",
        "1 passed, 0 failed",
    ]
    # The shopper's four calls (three messages, then "goal reached"), and nothing else, on the ledger.
    rows = list(UpstreamCall.objects.values_list("purpose", "tier", "message_id", "cost_usd"))
    assert rows == [("test", "simple", None, CALL_USD)] * 4
    assert Decimal(estimate.group(1)) > 4 * CALL_USD  # the estimate is an upper bound
    assert DemoOrder.objects.get(number="KF-1002").status == "placed"  # the sandbox simulated it

    # The model played the shopper: its instructions hold the persona, the goal, the facts and the
    # markers; the bot's answers are its "user" messages, its own messages its "assistant" ones.
    requests = remote.requests
    system = requests[0]["messages"][0]["content"]
    for part in ("Mei, a busy customer", "Cancel your order KF-1002", "email: mei.chen@example.com", "GOAL_REACHED"):
        assert part in system
    last = requests[3]["messages"]
    assert [m["role"] for m in last] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert [m["content"] for m in last[2::2]] == [
        "Hi, I want to cancel my order KF-1002",
        "mei.chen@example.com",
        "yes",
    ]
    assert "cancelled" in last[-1]["content"]
    assert requests[0]["max_tokens"] == 150 or requests[0].get("max_completion_tokens") == 150

    assert ET.parse(junit).getroot().get("tests") == "1"


def test_a_shopper_that_gives_up_fails_and_a_turn_limit_is_judged_by_its_outcome(
    order_faq, demo_orders, remote, tmp_path
):
    from routing.models import UpstreamCall

    remote.push(
        shopper("How long does delivery take?"),
        shopper("GIVE_UP"),
        shopper("How long does delivery take?"),
        shopper("And how long does delivery take to Shanghai?"),
        shopper("How long does delivery take, again?"),  # asked once more after its 2 turns: goes on
    )
    junit = tmp_path / "bot.xml"
    code, lines = bot_test(scenario_file(tmp_path, GIVES_UP + TURN_LIMIT), "--junit", str(junit))
    assert code == 1, lines
    assert lines[0].startswith("COST estimate: up to ")
    assert lines[1].startswith(
        "FAIL a shopper who gives up: gave up after 1 turn: expected goal reached; last answer: 'Orders ship"
    )
    assert lines[2] == "PASS a shopper who never finishes: turn limit hit after 2 turns"
    assert lines[3] == (
        f"COST spent: {5 * CALL_USD:f} USD by the simulated shoppers, 0.000000 USD by the bot's answers "
        "(ledger, purpose test)"
    )
    assert lines[-1] == "1 passed, 1 failed"
    assert UpstreamCall.objects.filter(purpose="test").count() == 5
    assert len(remote.requests) == 5
    failure = ET.parse(junit).getroot().find(".//failure")
    assert failure is not None and failure.text is not None
    assert "shopper: How long does delivery take?\n  assistant: Orders ship" in failure.text  # the transcript


def test_a_simulated_shopper_is_skipped_without_a_model_and_the_others_still_count(order_faq, demo_orders, tmp_path):
    from chat.models import Conversation

    code, lines = bot_test(scenario_file(tmp_path, FIXED + CANCEL))
    assert (code, lines) == (
        0,
        [
            "PASS delivery time from the FAQ",
            "SKIP a shopper cancels an order knowing its number and e-mail: "
            "no model is configured to play the shopper (no remote tier)",
            "1 passed, 0 failed, 1 skipped",
        ],
    )
    assert Conversation.objects.filter(sandbox=True).count() == 1  # the skipped one started none

    failing = FIXED.replace('contains: "1 business day"', "contains: Bitcoin")
    code, lines = bot_test(scenario_file(tmp_path, failing + CANCEL))
    assert code == 1 and lines[-1] == "0 passed, 1 failed, 1 skipped"


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("name: no goal\npersona: Mei, in a hurry\nmax_turns: 3\n", 2, "goal: required with persona"),
        ("name: no persona\n\ngoal: cancel KF-1002\n", 3, "persona: required with goal"),
        (
            "- name: both\n  persona: Mei\n  goal: cancel\n  turns:\n    - say: hi\n",
            4,
            "turns: not with persona and goal",
        ),
        ("name: limit\npersona: Mei\ngoal: cancel\nmax_turns: 0\n", 4, "max_turns: a whole number from 1 to 30"),
        ("name: o\npersona: Mei\ngoal: cancel\nexpect:\n  outcome: won\n", 5, "outcome: one of reached, gave_up"),
        ("name: k\nknows: [KF-1002]\nturns:\n  - say: hi\n", 2, "knows: only with persona and goal"),
    ],
)
def test_a_bad_simulated_shopper_exits_2_naming_its_line_and_field(tmp_path, text, line, problem):
    from chat.models import Conversation

    path = scenario_file(tmp_path, text)
    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("bot_test", path, stdout=out)
    assert raised.value.returncode == 2
    assert str(raised.value).startswith(f"{path}, line {line}: {problem}")
    assert out.getvalue().splitlines()[-1] == "0 passed, 0 failed"
    assert not Conversation.objects.exists()  # nothing ran


def test_the_shoppers_marker_ends_a_reply_and_what_precedes_it_is_kept():
    from routing.services import _shopper_ending

    assert _shopper_ending("Thanks, that's all.\nGOAL_REACHED") == ("Thanks, that's all.", "reached")
    assert _shopper_ending("**GIVE_UP**") == ("", "gave_up")
    assert _shopper_ending("ok thanks GOAL_REACHED.") == ("ok thanks", "reached")
    assert _shopper_ending("Is GOAL_REACHED a thing you track?") == ("Is GOAL_REACHED a thing you track?", "")
