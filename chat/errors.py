"""Chat's own errors. Each has a stable ``code`` (the WebSocket ``error`` frame's code where a
socket shows it) and says whether retrying could help (``permanent``), the shape of
``routing.providers.base.ProviderError``."""

from __future__ import annotations


class ChatError(Exception):
    """Base of chat's errors: ``code`` for the client, ``message`` for a person."""

    code = "invalid"
    permanent = True

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class AccessDenied(ChatError):
    """The conversation does not exist or the token is not its token (close code 4403)."""

    code = "forbidden"


class NotFound(ChatError):
    """No such conversation (or no such message in it)."""

    code = "not_found"


class InvalidFeedback(ChatError):
    """A rating that is not ``up``/``down``, or a message that is not a bot message of this
    conversation."""

    code = "invalid"


class AgentHolds(ChatError):
    """An agent holds the conversation: the bot must not answer (nothing was written)."""

    code = "agent_holds"


class AnswerInFlight(ChatError):
    """Another answer of the conversation is in flight (claimed, or its row still streaming), in
    this process or another: the next message waits for it (``services.answer_claim``; issue 29,
    one answer at a time per conversation). Never shown to the shopper."""

    code = "answer_in_flight"


class NotOwner(ChatError):
    """The conversation is not held by this agent. ``owner`` is the display name of the agent
    who holds it ("" when nobody does); ``status`` is the conversation's status."""

    code = "not_owner"

    def __init__(self, *, owner: str, status: str) -> None:
        super().__init__(f"held by {owner!r}" if owner else f"status is {status}")
        self.owner = owner
        self.status = status


class NotCached(ChatError):
    """The message is not a bot answer served from the answer cache (route ``cache.*`` with the
    entry it was served from recorded)."""

    code = "not_cached"


class NotAgent(ChatError):
    """The user is no longer an agent (deactivated, or the permission was taken away)."""

    code = "forbidden"


class OrderRefused(ChatError):
    """A store call made for the agent console did not do what was asked
    (``chat.services.orders``). ``code`` is the store's: ``not_found`` (no such order of this
    conversation's shopper), ``not_allowed`` (not possible in the order's state), ``invalid``,
    ``upstream`` (the store failed or timed out: try again) or ``not_configured`` (no store)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.permanent = code != "upstream"


class InvalidSearch(ChatError):
    """A staff search the console cannot run: ``invalid`` (an empty query) or ``too_long``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class AttachmentRefused(ChatError):
    """A message names an attachment that is not its conversation's, was sent by someone else,
    or is already part of another message (the shopper's ``error`` frame code ``forbidden``)."""

    code = "forbidden"
