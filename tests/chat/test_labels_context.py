"""Labels, the customer's context and canned replies in the console (issue 32 items 3-5;
docs/console.md): the rules behind the console's JSON endpoints, over Django's test client
(SQLite). Personas: ``alice`` (an agent), ``boss`` (an agent who may define labels and shared
replies), ``bob`` (another agent)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from chat import canned
from chat.models import CannedReply, Conversation, ConversationLabel, Label, Message
from chat.selectors import console_page, console_rows, label_q

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console import make_user

pytestmark = [pytest.mark.django_db]


def boss_user() -> Any:
    user = make_user("boss", first_name="Boss")
    user.user_permissions.add(
        Permission.objects.get(codename="manage_labels"), Permission.objects.get(codename="manage_shared_replies")
    )
    return type(user).objects.get(pk=user.pk)


def post(client: Any, url: str, body: Any, method: str = "post") -> Any:
    return getattr(client, method)(url, data=json.dumps(body), content_type="application/json")


def conv(said: str = "hello", **fields: Any) -> Conversation:
    c = Conversation.objects.create(token_hash="x" * 64, last_seq=1, **fields)
    Message.objects.create(conversation=c, seq=1, role="shopper", text=said)
    return c


# --- labels ---------------------------------------------------------------------------------------


def test_only_staff_with_the_permission_define_labels(client: Any) -> None:
    client.force_login(make_user("alice"))
    r = post(client, "/console/api/labels", {"name": "Refund", "color": "#d97706"})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "forbidden"
    assert not Label.objects.exists()
    assert client.get("/console/api/labels").json() == {"labels": [], "can_manage": False}

    client.force_login(boss_user())
    r = post(client, "/console/api/labels", {"name": "  Refund  ", "color": "#D97706"})
    assert r.status_code == 201
    label = r.json()["label"]
    assert label["name"] == "Refund" and label["color"] == "#d97706"
    assert post(client, "/console/api/labels", {"name": "refund", "color": "#000000"}).status_code == 400
    bad = post(client, "/console/api/labels", {"name": "VIP", "color": "red"})
    assert bad.status_code == 400 and "#rrggbb" in bad.json()["error"]["message"]
    renamed = post(client, f"/console/api/labels/{label['id']}", {"name": "Refunds", "color": "#111111"})
    assert renamed.json()["label"]["name"] == "Refunds"
    assert Label.objects.get().name == "Refunds"


def test_any_agent_sets_and_removes_a_label_and_the_row_carries_it(client: Any) -> None:
    refund = Label.objects.create(name="Refund", color="#d97706")
    vip = Label.objects.create(name="VIP", color="#2563eb")
    c = conv(status="waiting_agent")
    client.force_login(make_user("alice"))
    url = f"/console/api/conversations/{c.pk}/labels"
    assert post(client, url, {"label": vip.pk, "on": True}).json() == {"labels": [vip.pk]}
    assert post(client, url, {"label": refund.pk, "on": True}).json() == {"labels": sorted([refund.pk, vip.pk])}
    assert post(client, url, {"label": refund.pk, "on": True}).json()["labels"] == sorted([refund.pk, vip.pk])
    assert ConversationLabel.objects.filter(conversation=c).count() == 2
    (row,) = console_rows(queryset=Conversation.objects.filter(pk=c.pk))
    assert row["labels"] == sorted([refund.pk, vip.pk])
    assert post(client, url, {"label": vip.pk, "on": False}).json() == {"labels": [refund.pk]}
    rows, _ = console_page(status="waiting_agent", after=None, limit=10)
    assert [r["labels"] for r in rows] == [[refund.pk]]
    assert post(client, url, {"label": 999999, "on": True}).status_code == 404
    assert post(client, url, {"label": "Refund", "on": True}).status_code == 400
    assert post(client, url, {"label": refund.pk}).status_code == 400


def test_the_inbox_filters_by_label(client: Any) -> None:
    refund = Label.objects.create(name="Refund", color="#d97706")
    a, b, closed = conv(status="waiting_agent"), conv(status="bot"), conv(status="closed")
    for c in (a, closed):
        ConversationLabel.objects.create(conversation=c, label=refund)
    assert set(Conversation.objects.filter(label_q(refund.pk)).values_list("pk", flat=True)) == {a.pk, closed.pk}
    client.force_login(make_user("alice"))
    got = client.get(f"/console/api/labels/{refund.pk}/conversations").json()["conversations"]
    assert [r["id"] for r in got] == [str(a.pk)]  # closed ones are out of the inbox
    assert str(b.pk) not in {r["id"] for r in got}
    assert client.get("/console/api/labels/999999/conversations").status_code == 404


def test_deleting_a_label_takes_it_off_every_conversation(client: Any) -> None:
    refund = Label.objects.create(name="Refund", color="#d97706")
    c = conv(status="bot")
    ConversationLabel.objects.create(conversation=c, label=refund)
    client.force_login(make_user("alice"))
    assert client.delete(f"/console/api/labels/{refund.pk}").status_code == 403
    client.force_login(boss_user())
    assert client.delete(f"/console/api/labels/{refund.pk}").json() == {"deleted": refund.pk}
    assert not ConversationLabel.objects.exists()


# --- the customer's context -------------------------------------------------------------------------


def test_earlier_conversations_never_show_another_customer(client: Any) -> None:
    # Two shoppers with the same name and different e-mails: two customers.
    old_li = conv(customer_id="c-1", customer_name="Li Wei", customer_email="li@a.example", said="old question")
    other_li = conv(customer_id="c-2", customer_name="Li Wei", customer_email="wei@b.example", said="not mine")
    left_mail = conv(contact_email="LI@A.example", said="left my address")  # anonymous, same address
    # Verified as another customer, with the same address: still another person.
    impostor = conv(customer_id="c-3", customer_name="Li Wei", customer_email="li@a.example", said="impostor")
    empty = Conversation.objects.create(token_hash="x" * 64, customer_id="c-1")  # no message: not listed
    now = conv(customer_id="c-1", customer_name="Li Wei", customer_email="li@a.example", said="hi again")
    client.force_login(make_user("alice"))
    got = client.get(f"/console/api/conversations/{now.pk}/context").json()["earlier"]
    ids = [e["id"] for e in got]
    assert set(ids) == {str(old_li.pk), str(left_mail.pk)}
    assert str(other_li.pk) not in ids and str(impostor.pk) not in ids and str(empty.pk) not in ids
    assert ids == [str(left_mail.pk), str(old_li.pk)]  # newest first
    by_id = {e["id"]: e for e in got}
    assert by_id[str(old_li.pk)]["match"] == "customer"
    assert by_id[str(old_li.pk)]["first_text"] == "old question"
    assert by_id[str(left_mail.pk)]["match"] == "email"
    assert by_id[str(old_li.pk)]["transcript"] == f"/console/conversations/{old_li.pk}/"
    # The other Li Wei sees only their own (none).
    assert client.get(f"/console/api/conversations/{other_li.pk}/context").json()["earlier"] == []


def test_an_anonymous_shopper_without_an_address_has_no_earlier_conversations(client: Any) -> None:
    conv(said="someone")
    anon = conv(said="me")
    client.force_login(make_user("alice"))
    assert client.get(f"/console/api/conversations/{anon.pk}/context").json()["earlier"] == []
    import uuid

    assert client.get(f"/console/api/conversations/{uuid.uuid4()}/context").status_code == 404


# --- canned replies ---------------------------------------------------------------------------------


def test_shared_replies_need_the_permission_and_personal_ones_stay_personal(client: Any) -> None:
    client.force_login(make_user("alice"))
    shared = {"title": "Hello", "text": "Hello {name}", "shortcut": "hi", "shared": True}
    assert post(client, "/console/api/canned", shared).status_code == 403
    mine = post(client, "/console/api/canned", {"title": "Mine", "text": "Thanks!", "shortcut": "ty"})
    assert mine.status_code == 201 and mine.json()["reply"]["shared"] is False
    mine_id = mine.json()["reply"]["id"]
    assert post(client, "/console/api/canned", {"title": "Again", "text": "x", "shortcut": "ty"}).status_code == 400
    assert (
        post(client, "/console/api/canned", {"title": "Bad", "text": "x", "shortcut": "two words"}).status_code == 400
    )

    client.force_login(boss_user())
    made = post(client, "/console/api/canned", shared)
    assert made.status_code == 201
    shared_id = made.json()["reply"]["id"]
    # The same shortcut in another scope is allowed: boss's own /ty.
    assert (
        post(client, "/console/api/canned", {"title": "Boss ty", "text": "Cheers", "shortcut": "ty"}).status_code == 201
    )
    # Alice's personal reply is not boss's to see, edit or delete.
    assert mine_id not in {r["id"] for r in client.get("/console/api/canned").json()["replies"]}
    assert post(client, f"/console/api/canned/{mine_id}", {"title": "x", "text": "y"}).status_code == 404
    assert client.delete(f"/console/api/canned/{mine_id}").status_code == 404

    client.force_login(make_user("alice"))
    listed = client.get("/console/api/canned").json()
    assert {r["id"]: r["editable"] for r in listed["replies"]} == {shared_id: False, mine_id: True}
    assert post(client, f"/console/api/canned/{shared_id}", {"title": "x", "text": "y"}).status_code == 403
    assert client.delete(f"/console/api/canned/{shared_id}").status_code == 403
    edited = post(client, f"/console/api/canned/{mine_id}", {"title": "Mine", "text": "Thank you!", "shortcut": "ty"})
    assert edited.json()["reply"]["text"] == "Thank you!"
    assert client.delete(f"/console/api/canned/{mine_id}").json() == {"deleted": mine_id}
    assert CannedReply.objects.filter(pk=shared_id).exists() and not CannedReply.objects.filter(pk=mine_id).exists()


def test_placeholders_are_filled_from_the_conversation(client: Any) -> None:
    c = conv(customer_id="c-1", customer_name="Li Wei", customer_email="li@a.example", locale="en")
    Message.objects.create(conversation=c, seq=2, role="shopper", text="where is order KF-1001?")
    Message.objects.create(conversation=c, seq=3, role="bot", text="Order KF-1001 shipped.")
    Message.objects.create(conversation=c, seq=4, role="shopper", text="and #2002 too")
    Message.objects.create(conversation=c, seq=5, role="shopper", text="thanks")
    CannedReply.objects.create(title="Status", shortcut="st", text="Hi {name}, order {order_number} is on its way.")
    client.force_login(make_user("alice"))
    body = client.get(f"/console/api/conversations/{c.pk}/context").json()
    assert body["fill"] == {"name": "Li Wei", "order_number": "2002"}
    assert [r["text"] for r in body["canned"]] == ["Hi Li Wei, order 2002 is on its way."]
    # Nothing to fill it with: the placeholder stays for the agent to complete.
    anon = conv(said="hello")
    (reply,) = client.get(f"/console/api/conversations/{anon.pk}/context").json()["canned"]
    assert reply["text"] == "Hi {name}, order {order_number} is on its way."
    assert (
        canned.fill("{name} {other} {order_number}", {"name": "Ann", "order_number": ""})
        == "Ann {other} {order_number}"
    )


def test_the_conversations_language_chooses_the_text(client: Any) -> None:
    CannedReply.objects.create(
        title="Thanks", shortcut="ty", text="Thank you, {name}!", texts={"zh": "谢谢 {name}！", "fr": "Merci {name} !"}
    )
    CannedReply.objects.create(title="English only", shortcut="en1", text="English only", locale="en")
    zh = conv(locale="zh-hans", customer_id="c-9", customer_name="王芳")
    en = conv(locale="en", customer_id="c-8", customer_name="Ann")
    de = conv(locale="de")
    client.force_login(make_user("alice"))
    texts = {
        c.pk: {
            r["shortcut"]: r["text"] for r in client.get(f"/console/api/conversations/{c.pk}/context").json()["canned"]
        }
        for c in (zh, en, de)
    }
    assert texts[zh.pk] == {"ty": "谢谢 王芳！"}  # the English-only reply is not offered in Chinese
    assert texts[en.pk] == {"ty": "Thank you, Ann!", "en1": "English only"}
    assert texts[de.pk] == {"ty": "Thank you, {name}!"}  # no German text: the default


# --- Ops ------------------------------------------------------------------------------------------


def test_ops_counts_each_labels_conversations_and_their_outcomes(client: Any) -> None:
    refund = Label.objects.create(name="Refund", color="#d97706")
    Label.objects.create(name="VIP", color="#2563eb")
    handed = conv(said="I want a refund")  # an agent wrote: unresolved (handoff)
    Message.objects.create(conversation=handed, seq=2, role="bot", text="Refunds take 5 days.", route="faq")
    Message.objects.create(conversation=handed, seq=3, role="agent", text="Let me look.", agent_name="Alice")
    fresh = conv(said="refund please")  # a bot answer, its window not passed: open
    Message.objects.create(conversation=fresh, seq=2, role="bot", text="Here is how.", route="faq")
    for c in (handed, fresh):
        ConversationLabel.objects.create(conversation=c, label=refund)
    conv(said="unlabelled")
    staff = make_user("ops", first_name="Ops")
    staff.user_permissions.add(Permission.objects.get(codename="view_costs"))
    client.force_login(type(staff).objects.get(pk=staff.pk))
    page = client.get("/ops/?hours=24")
    assert page.status_code == 200
    html = page.content.decode()
    assert '<tr data-label="Refund"><td>Refund</td><td>2</td><td>0 / 0</td><td>1</td><td>1</td></tr>' in html
    assert '<tr data-label="VIP"><td>VIP</td><td>0</td><td>0 / 0</td><td>0</td><td>0</td></tr>' in html
