"""Assignment (issue 32, docs/console.md#assignment): every open conversation may have an
assignee, the agent who owns it. It is not a take-over: the conversation keeps waiting and the
bot keeps helping until the assignee (or anyone) takes it over, and a take-over makes the taker
the assignee.

* Manual: any agent assigns an open conversation to a colleague (or to themselves, "assign to
  me"), or back to Unassigned, with an optional note stored as an internal note
  ("Alice → Bob: wants a refund"). A conversation the assigning agent holds is *transferred*: it
  goes back to the queue (status ``waiting_agent``, the bot helps meanwhile) assigned to the
  colleague. One another agent holds cannot be reassigned (``NotOwner``).
* Automatic (``KEFU_AUTO_ASSIGN``, off by default): each unassigned waiting conversation, oldest
  first, goes round-robin to an online agent (a live lease, ``chat.presence``) who is not away and
  owns fewer than ``KEFU_ASSIGN_LIMIT`` open conversations (``bot``, ``waiting_agent`` or
  ``agent``). The decision is made in the database: the candidates' :class:`AgentState` rows are
  locked (``SELECT ... FOR UPDATE``, in agent id order) for the count and the pick, and the
  conversation is assigned by a conditional UPDATE (still waiting, still unassigned). Two workers
  deciding at once therefore decide one after the other: a conversation is assigned once and the
  limit holds. A take-over locks the taker's row first too, so the counts include it.
* Release: an assignee who turns "away" or whose leases all ran out (the lease rule of
  ``chat.presence``; the sweeper releases what they held) gives back every open conversation
  they own but do not hold: it is Unassigned again (and auto-assigned anew when that is on).

All functions but the ``publish*``/``sweep`` coroutines are synchronous (the ORM).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from . import events, presence
from .errors import NotAgent, NotFound, NotOwner
from .models import AgentLease, AgentState, Conversation, ConversationStatus, InternalNote
from .selectors import console_rows, note_item, user_is_agent
from .services import HandBack, OwnerChange, agent_display_name, unanswered_by_anyone

log = logging.getLogger(__name__)

#: The statuses of an open conversation: those an assignee owns and the limit counts.
OPEN_STATUSES = (ConversationStatus.BOT, ConversationStatus.WAITING_AGENT, ConversationStatus.AGENT)
NOTE_MAX_CHARS = 1000


def assigned_q(user: Any) -> Q:
    """The conversations assigned to ``user`` (a user or a user id), as a ``Q`` on
    ``Conversation``: what the inbox's "Mine" ORs with the conversations the agent holds."""
    return Q(assignee_id=getattr(user, "pk", user))


@dataclass(frozen=True)
class Assignment:
    """One change of a conversation's assignee, made by this call.

    ``assignee_id``/``assignee_name``: the new assignee (None/"" for Unassigned); ``previous_id``
    the one before; ``by``: the display name of the agent who assigned ("" for the automatic
    rules); ``reason``: ``manual``, ``auto``, ``take_over``, ``away`` or ``gone``; ``note``: the
    internal note stored with it (None when none); ``owner``: the owner change when a held
    conversation was transferred back to the queue (publish it), else None; ``back``: then also
    the conversation and what the shopper sent since anyone last replied (the bot answers it)."""

    conversation_id: uuid.UUID
    assignee_id: int | None
    assignee_name: str
    previous_id: int | None
    by: str
    reason: str
    note: InternalNote | None = None
    owner: OwnerChange | None = None
    back: HandBack | None = None


def states_ensure(agent_ids: list[int]) -> None:
    """Create the missing :class:`AgentState` rows of ``agent_ids`` (not away, never assigned)."""
    if agent_ids:
        AgentState.objects.bulk_create([AgentState(agent_id=i) for i in agent_ids], ignore_conflicts=True)


def _live_agent_ids() -> list[int]:
    return sorted(
        set(AgentLease.objects.filter(expires_at__gt=timezone.now()).values_list("agent_id", flat=True).distinct())
    )


def team() -> list[dict[str, Any]]:
    """The agents online now (a live lease), by name: ``[{"id": int, "name": str, "away": bool,
    "open": int}]`` (``open``: the open conversations assigned to them). One query."""
    now = timezone.now()
    open_n = (
        Conversation.objects.filter(assignee_id=OuterRef("pk"), status__in=OPEN_STATUSES)
        .order_by()
        .values("assignee_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    users = (
        get_user_model()
        .objects.filter(Exists(AgentLease.objects.filter(agent_id=OuterRef("pk"), expires_at__gt=now)), is_active=True)
        .annotate(
            is_away=Exists(AgentState.objects.filter(agent_id=OuterRef("pk"), away=True)),
            open_n=Coalesce(Subquery(open_n), 0),
        )
    )
    out = [{"id": u.pk, "name": agent_display_name(u), "away": bool(u.is_away), "open": int(u.open_n)} for u in users]
    return sorted(out, key=lambda a: (str(a["name"]).lower(), a["id"]))


def _open_counts(agent_ids: list[int]) -> dict[int, int]:
    rows = (
        Conversation.objects.filter(assignee_id__in=agent_ids, status__in=OPEN_STATUSES)
        .values("assignee_id")
        .annotate(n=Count("pk"))
    )
    return {int(r["assignee_id"]): int(r["n"]) for r in rows}


def _note(conversation_id: uuid.UUID, author: Any, text: str) -> InternalNote:
    return InternalNote.objects.create(
        conversation_id=conversation_id, author=author, author_name=agent_display_name(author), text=text
    )


def conversation_assign(*, conversation_id: uuid.UUID, to: int | None, by: Any, note: str = "") -> Assignment | None:
    """Agent ``by`` assigns the conversation to agent id ``to`` (None: Unassigned), with ``note``
    (stored as an internal note "By → To: note", at most ``NOTE_MAX_CHARS``; the note is stored
    even when the assignee does not change). A conversation ``by`` holds is transferred: back to
    the queue, assigned to ``to``, epoch + 1 (``owner`` in the result).

    Returns the change, or None when the assignee was already ``to`` and no note was given.
    Raises ``NotFound`` (no such conversation), ``NotAgent`` (``to`` is not an active agent),
    ``NotOwner`` (another agent holds it), ``ValueError`` (closed: "closed")."""
    target = None
    if to is not None:
        target = get_user_model().objects.filter(pk=to).first()
        if target is None or not user_is_agent(target):
            raise NotAgent(str(to))
    name = agent_display_name(target) if target is not None else ""
    note = " ".join(note.split())[:NOTE_MAX_CHARS]
    with transaction.atomic():
        row = (
            Conversation.objects.select_for_update()
            .filter(pk=conversation_id)
            .values("status", "agent_id", "agent_name", "assignee_id")
            .first()
        )
        if row is None:
            raise NotFound(str(conversation_id))
        if row["status"] == ConversationStatus.CLOSED:
            raise ValueError("closed")
        held = row["status"] == ConversationStatus.AGENT
        if held and row["agent_id"] != by.pk and row["agent_id"] != to:
            raise NotOwner(owner=row["agent_name"], status=row["status"])
        owner = back = None
        now = timezone.now()
        if row["assignee_id"] == to and not note and not (held and row["agent_id"] != to):
            return None
        fields: dict[str, Any] = {"assignee_id": to, "assignee_name": name, "updated_at": now}
        if held and row["agent_id"] != to:  # the holder transfers it: back to the queue
            fields.update(
                status=ConversationStatus.WAITING_AGENT,
                agent=None,
                agent_name="",
                owner_epoch=F("owner_epoch") + 1,
                waiting_since=now,
                handoff_reason=f"transferred by {agent_display_name(by)}"[:200],
            )
        Conversation.objects.filter(pk=conversation_id).update(**fields)
        if "status" in fields:
            state = Conversation.objects.filter(pk=conversation_id).values_list("owner_epoch", flat=True).get()
            owner = OwnerChange(conversation_id, True, ConversationStatus.WAITING_AGENT, "", None, int(state))
            back = HandBack(
                change=owner,
                conversation=Conversation.objects.get(pk=conversation_id),
                unanswered=tuple(unanswered_by_anyone(conversation_id)),
            )
        text = f"{agent_display_name(by)} → {name or '∅'}" + (f": {note}" if note else "")
        stored = _note(conversation_id, by, text)
    return Assignment(
        conversation_id,
        to,
        name,
        row["assignee_id"],
        agent_display_name(by),
        "manual",
        note=stored,
        owner=owner,
        back=back,
    )


def auto_assign(*, conversation_ids: list[uuid.UUID] | None = None) -> list[Assignment]:
    """Assign unassigned waiting conversations (those of ``conversation_ids``, or all, oldest
    wait first) round-robin under ``KEFU_ASSIGN_LIMIT`` (module docstring); one transaction per
    conversation, each deciding with the candidates' rows locked. Stops when no agent can take
    more. Returns the assignments made by this call (none when ``KEFU_AUTO_ASSIGN`` is off)."""
    if not settings.KEFU_AUTO_ASSIGN:
        return []
    waiting = Conversation.objects.filter(status=ConversationStatus.WAITING_AGENT, assignee__isnull=True, sandbox=False)
    if conversation_ids is not None:
        waiting = waiting.filter(pk__in=conversation_ids)
    todo = list(waiting.order_by("waiting_since", "id").values_list("pk", flat=True)[:200])
    if not todo:
        return []
    states_ensure(_live_agent_ids())
    made: list[Assignment] = []
    for cid in todo:
        done = _assign_one(cid)
        if done is False:
            break  # every agent is full (or none is online)
        if isinstance(done, Assignment):
            made.append(done)
    return made


def _assign_one(conversation_id: uuid.UUID) -> Assignment | bool | None:
    """One round-robin decision (False: no agent can take it; None: it was no longer waiting and
    unassigned)."""
    limit = settings.KEFU_ASSIGN_LIMIT
    with transaction.atomic():
        now = timezone.now()
        live = AgentLease.objects.filter(expires_at__gt=now).values("agent_id")
        candidates = list(
            AgentState.objects.select_for_update()
            .filter(agent_id__in=live, away=False, agent__is_active=True)
            .order_by("agent_id")
            .values_list("agent_id", "last_assigned_at")
        )
        if not candidates:
            return False
        counts = _open_counts([a for a, _ in candidates])
        free = [(a, at) for a, at in candidates if counts.get(a, 0) < limit]
        if not free:
            return False
        # The round-robin's turn: the agent assigned longest ago (never: first), then by id.
        free.sort(key=lambda c: (c[1] is not None, c[1] or now, c[0]))
        users = {u.pk: u for u in get_user_model().objects.filter(pk__in=[a for a, _ in free])}
        pick = next((a for a, _ in free if a in users and user_is_agent(users[a])), None)
        if pick is None:
            return False
        name = agent_display_name(users[pick])
        won = Conversation.objects.filter(
            pk=conversation_id, status=ConversationStatus.WAITING_AGENT, assignee__isnull=True
        ).update(assignee_id=pick, assignee_name=name, updated_at=now)
        if not won:
            return None
        AgentState.objects.filter(agent_id=pick).update(last_assigned_at=now)
    log.info("conversation %s auto-assigned to agent %s", conversation_id, pick)
    return Assignment(conversation_id, pick, name, None, "", "auto")


def release_unavailable() -> list[Assignment]:
    """Unassign every open conversation whose assignee is away or gone (no live lease) and does
    not hold it; each by a conditional UPDATE (still theirs), so of several sweeping processes one
    releases it. Returns the releases made by this call (reason ``away`` or ``gone``)."""
    owned = list(
        Conversation.objects.filter(assignee__isnull=False, status__in=OPEN_STATUSES)
        .exclude(status=ConversationStatus.AGENT, agent_id=F("assignee_id"))
        .values_list("pk", "assignee_id")
    )
    if not owned:
        return []
    ids = sorted({a for _, a in owned})
    gone = presence.gone_agents(ids)
    away = set(AgentState.objects.filter(agent_id__in=ids, away=True).values_list("agent_id", flat=True))
    out = []
    for cid, agent_id in owned:
        if agent_id not in gone and agent_id not in away:
            continue
        done = (
            Conversation.objects.filter(pk=cid, assignee_id=agent_id)
            .exclude(status=ConversationStatus.AGENT, agent_id=agent_id)
            .update(assignee=None, assignee_name="", updated_at=timezone.now())
        )
        if done:
            out.append(Assignment(cid, None, "", agent_id, "", "away" if agent_id in away else "gone"))
    return out


def agent_away_set(*, agent: Any, away: bool) -> list[Assignment]:
    """Agent ``agent`` turns away (``away`` True: no assignments, no alerts, and the open
    conversations assigned to them that they do not hold are Unassigned again) or back. Returns
    the releases."""
    states_ensure([agent.pk])
    AgentState.objects.filter(agent_id=agent.pk).update(away=away, updated_at=timezone.now())
    if not away:
        return []
    out = []
    for cid in list(
        Conversation.objects.filter(assignee_id=agent.pk, status__in=OPEN_STATUSES)
        .exclude(status=ConversationStatus.AGENT, agent_id=agent.pk)
        .values_list("pk", flat=True)
    ):
        if Conversation.objects.filter(pk=cid, assignee_id=agent.pk).update(
            assignee=None, assignee_name="", updated_at=timezone.now()
        ):
            out.append(Assignment(cid, None, "", agent.pk, agent_display_name(agent), "away"))
    return out


# --- publishing (after the writes committed) ---------------------------------------------------


def assignment_frame(change: Assignment, row: dict[str, Any] | None) -> dict[str, Any]:
    """The ``assignment`` frame every console gets (docs/protocol.md): ``{"type": "assignment",
    "conversation", "assignee": {"id", "name"} | None, "previous": int | None, "by", "reason",
    "note": str, "info": console row | None}``."""
    return {
        "type": "assignment",
        "conversation": str(change.conversation_id),
        "assignee": {"id": change.assignee_id, "name": change.assignee_name} if change.assignee_id else None,
        "previous": change.previous_id,
        "by": change.by,
        "reason": change.reason,
        "note": change.note.text if change.note is not None else "",
        "info": row,
    }


async def publish(changes: list[Assignment]) -> None:
    """Publish each change: the owner change of a transfer (``status`` to the conversation and the
    list), its note to the agents following the conversation, and the ``assignment`` frame to
    every console (with the conversation's row, so an assignee whose list does not show it gets it)."""
    for change in changes:
        if change.owner is not None:
            await events.publish_owner_change(
                conversation_id=change.conversation_id,
                status=change.owner.status,
                agent="",
                epoch=change.owner.epoch,
            )
        if change.note is not None:
            await events.publish_staff(change.conversation_id, {"type": "note", **note_item(change.note)})
        rows = await database_sync_to_async(console_rows)(
            queryset=Conversation.objects.filter(pk=change.conversation_id)
        )
        await events.publish_agents(assignment_frame(change, rows[0] if rows else None))


async def publish_team(agents: list[dict[str, Any]] | None = None) -> None:
    """Send every console the ``team`` frame: who is online and who is away (``agents``, as
    :func:`team` returns it; read now when None)."""
    if agents is None:
        agents = await database_sync_to_async(team)()
    await events.publish_agents({"type": "team", "agents": agents})


_team_told: list[list[dict[str, Any]]] = [[]]


async def sweep() -> int:
    """The sweeper's turn (``chat.sweeper``): release the conversations of assignees away or gone,
    then auto-assign the waiting ones (when on), and publish; a ``team`` frame too when who is
    online changed since this process last told (an agent's lease ran out). Returns the number of
    assignment changes."""
    released = await database_sync_to_async(release_unavailable)()
    made = await database_sync_to_async(auto_assign)()
    await publish(released + made)
    now = await database_sync_to_async(team)()
    if [(a["id"], a["away"]) for a in now] != [(a["id"], a["away"]) for a in _team_told[0]]:
        _team_told[0] = now
        await events.publish_agents({"type": "team", "agents": now})
    return len(released) + len(made)


async def auto_assign_now(conversation_id: uuid.UUID) -> list[Assignment]:
    """A conversation just entered the queue: auto-assign it now (when on; nothing published:
    the caller publishes the changes with :func:`publish`)."""
    if not settings.KEFU_AUTO_ASSIGN:
        return []
    return await database_sync_to_async(auto_assign)(conversation_ids=[conversation_id])
