"""Writes to conversations and messages. Every user-facing write goes through a function here;
each returns what the caller must publish (frames), and the caller publishes only after the
function returned, i.e. after its transaction committed (Zulip's actions, HackSoft's services).

Split by job: ``conversations`` (start, authenticate, status, the queue), ``messages`` (store,
claim, the bot's answer, ratings) and ``console`` (the agents' writes). All synchronous (the ORM).
"""

from .console import (
    CacheWrongResult,
    HandBack,
    OwnerChange,
    agent_display_name,
    agent_message_send,
    cache_answer_mark_wrong,
    conversation_close,
    conversation_hand_back,
    conversation_take_over,
    conversations_of_gone_agents,
    note_add,
    unanswered_by_anyone,
)
from .conversations import (
    Escalation,
    conversation_authenticate,
    conversation_escalate,
    conversation_set_status,
    conversation_start,
    next_seq,
)
from .messages import (
    Orphan,
    Received,
    answer_claim,
    answer_lease_renew,
    answer_leases_end,
    bot_message_begin,
    bot_message_finish,
    claim_release,
    claim_renew,
    feedback_record,
    message_receive,
    orphan_claim_take,
    orphan_finish,
    orphaned_answers,
    orphaned_claims,
)

__all__ = [
    "CacheWrongResult",
    "Escalation",
    "HandBack",
    "Orphan",
    "OwnerChange",
    "Received",
    "agent_display_name",
    "agent_message_send",
    "answer_claim",
    "answer_lease_renew",
    "answer_leases_end",
    "bot_message_begin",
    "bot_message_finish",
    "cache_answer_mark_wrong",
    "claim_release",
    "claim_renew",
    "conversation_authenticate",
    "conversation_close",
    "conversation_escalate",
    "conversation_hand_back",
    "conversation_set_status",
    "conversation_start",
    "conversation_take_over",
    "conversations_of_gone_agents",
    "feedback_record",
    "message_receive",
    "next_seq",
    "note_add",
    "orphan_claim_take",
    "orphan_finish",
    "orphaned_answers",
    "orphaned_claims",
    "unanswered_by_anyone",
]
