"""The upstream call as a frozen value, and what calling it learned as another.

A :class:`Call` is the plan of one remote call: which tier and deployment, with which request,
for whom. It is built once by the room that decided the answer (``routing.decide.decision``,
the gateway, a one-shot helper) and never changed afterwards: the canary sends a call to its
tier's candidate by returning a new ``Call`` (``routing.upstream.canary.assign``), a store tool's
next round is a new ``Call`` too (``routing.orders.tools``).

Where the call ends up is only known while it streams (a retry, a fallback to the next tier, a
canary candidate followed by the tier's own model), so ``stream_with_fallback``
(``routing.upstream.resilience``) says it with a value in the stream: an :class:`Answered` item
just before the first item of the attempt that answered. It comes before the text rather than
with the end because a stream cut after its first token has no end, yet its answer is recorded
against the deployment that streamed it. Single flight hands the leader's ``Answered`` to its
followers (``routing.upstream.singleflight``); the caller builds its records from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from routing.providers.base import ChatRequest, Provider, StreamItem
from routing.types import CallContext
from routing.upstream.tiers import CURRENT

__all__ = ["Answered", "Call", "CallItem"]


@dataclass(frozen=True, slots=True)
class Call:
    """One remote call as planned (frozen).

    ``tier``: the tier it starts at (``simple``, ``medium``, ``complex``); ``request``: what is
    sent (its ``model`` is the deployment's; ``max_tokens`` in tokens); ``provider``: the provider
    made for (``tier``, ``variant``), None to make one (``routing.upstream.tiers.provider_for``);
    ``variant``: the deployment of ``tier`` tried first, ``current`` (the tier's own model) or
    ``candidate`` (its canary candidate, ``routing.upstream.canary``); ``tiers_allowed``: the tiers
    the spend budgets leave open to its fallbacks (None: every configured tier); ``trial``: the
    deployment is a canary candidate on trial, whose answer is shared with no other question;
    ``context``: who the call is for, stored on its ledger rows (purpose ``answer``, ``tool``,
    ``gateway``...)."""

    tier: str
    request: ChatRequest
    provider: Provider | None = None
    variant: str = CURRENT
    tiers_allowed: tuple[str, ...] | None = None
    trial: bool = False
    context: CallContext = field(default_factory=CallContext)

    @property
    def route(self) -> str:
        """The route an answer of this call takes before any fallback: ``llm.<tier>``."""
        return f"llm.{self.tier}"


@dataclass(frozen=True, slots=True)
class Answered:
    """Which deployment answered a call (frozen): the stream item ``stream_with_fallback`` yields
    just before the first item of the attempt that answered (again, should a later attempt take
    over after an attempt that sent no text).

    ``tier`` and ``variant`` (``current``/``candidate``): the deployment; ``request``: the request
    it was sent (``request.model`` names the model asked; the stream's ``StreamDone.model`` the
    one the upstream says answered); ``provider``: the provider that streamed it (a store tool's
    next round goes to the same upstream); ``shareable``: False once the answer holds what only
    its asker may see (a store tool's result, ``routing.orders.tools``)."""

    tier: str
    variant: str
    request: ChatRequest
    provider: Provider
    shareable: bool = True

    @property
    def route(self) -> str:
        """The route the answer ended on: ``llm.<tier>``."""
        return f"llm.{self.tier}"

    @property
    def model(self) -> str:
        """The model the deployment was asked for (``request.model``)."""
        return self.request.model


#: What a remote call's stream yields: the provider's items and the :class:`Answered` values.
CallItem = StreamItem | Answered
