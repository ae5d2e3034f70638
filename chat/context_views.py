"""The console's JSON endpoints for labels, the customer's context and canned replies
(issue 32 items 3-5; docs/console.md). Agents only (``chat.views._agent_only``: anonymous users are
sent to the login page, other users get 403). Errors are ``{"error": {"code", "message"}}`` with
400 (bad input), 403 (a permission missing), 404 (unknown id) or 405 (method).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse, JsonResponse

from . import canned, context, events, labels
from .errors import ChatError
from .views import _agent_only

_STATUS = {"forbidden": 403, "not_found": 404}


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _chat_error(e: ChatError) -> JsonResponse:
    return _error(_STATUS.get(e.code, 400), e.code, e.message)


def _body(request: HttpRequest) -> Any:
    """The request's JSON body. Raises :class:`ChatError` (``invalid``) when it is not JSON."""
    try:
        return json.loads(request.body or b"{}")
    except ValueError:
        raise ChatError("the body is not JSON") from None


def _methods(request: HttpRequest, allowed: tuple[str, ...]) -> JsonResponse | None:
    if request.method in allowed:
        return None
    return _error(405, "method_not_allowed", f"use {' or '.join(allowed)}")


@_agent_only
def labels_api(request: HttpRequest) -> HttpResponse:
    """``GET /console/api/labels`` -> ``{"labels": [{"id", "name", "color"}], "can_manage": bool}``;
    ``POST`` ``{"name", "color": "#rrggbb"}`` creates one (``chat.manage_labels``) -> 201 ``{"label"}``."""
    if bad := _methods(request, ("GET", "POST")):
        return bad
    if request.method == "GET":
        return JsonResponse({"labels": labels.labels_list(), "can_manage": labels.can_manage_labels(request.user)})
    try:
        body = _body(request)
        if not isinstance(body, dict):
            raise labels.InvalidLabel("a label is a JSON object")
        item = labels.label_save(user=request.user, label_id=None, name=body.get("name"), color=body.get("color"))
    except ChatError as e:
        return _chat_error(e)
    return JsonResponse({"label": item}, status=201)


@_agent_only
def label_api(request: HttpRequest, label_id: int) -> HttpResponse:
    """``POST /console/api/labels/<id>`` ``{"name", "color"}`` renames/recolours a label,
    ``DELETE`` deletes it (both ``chat.manage_labels``) -> ``{"label"}`` / ``{"deleted": id}``."""
    if bad := _methods(request, ("POST", "DELETE")):
        return bad
    try:
        if request.method == "DELETE":
            labels.label_delete(user=request.user, label_id=label_id)
            return JsonResponse({"deleted": label_id})
        body = _body(request)
        if not isinstance(body, dict):
            raise labels.InvalidLabel("a label is a JSON object")
        item = labels.label_save(user=request.user, label_id=label_id, name=body.get("name"), color=body.get("color"))
    except ChatError as e:
        return _chat_error(e)
    return JsonResponse({"label": item})


@_agent_only
def label_conversations_api(request: HttpRequest, label_id: int) -> HttpResponse:
    """``GET /console/api/labels/<id>/conversations``: the inbox filtered by the label ->
    ``{"conversations": [console row...]}`` (open ones, newest activity first, at most 100)."""
    if bad := _methods(request, ("GET",)):
        return bad
    try:
        rows = labels.label_conversations(label_id=label_id)
    except ChatError as e:
        return _chat_error(e)
    return JsonResponse({"conversations": rows})


@_agent_only
def conversation_labels_api(request: HttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """``POST /console/api/conversations/<id>/labels`` ``{"label": id, "on": bool}``: set or take
    off a label -> ``{"labels": [id...]}``; every console then gets ``conversation.update`` with
    the row's ``labels`` (docs/protocol.md)."""
    if bad := _methods(request, ("POST",)):
        return bad
    try:
        body = _body(request)
        if not isinstance(body, dict) or not isinstance(body.get("on"), bool):
            raise labels.InvalidLabel('say {"label": id, "on": true | false}')
        ids = labels.conversation_label_set(
            conversation_id=conversation_id, label_id=body.get("label"), on=body["on"], user=request.user
        )
    except ChatError as e:
        return _chat_error(e)
    async_to_sync(events.publish_agents)(
        {"type": "conversation.update", "conversation": str(conversation_id), "labels": ids}
    )
    return JsonResponse({"labels": ids})


@_agent_only
def conversation_context_api(request: HttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """``GET /console/api/conversations/<id>/context``: what the console shows beside the open
    conversation -> ``{"labels": [id...], "earlier": [chat.context.earlier_conversations item...],
    "fill": {"name", "order_number"}, "canned": [{"id", "title", "shortcut", "text" (the
    conversation's language, placeholders filled), "shared"}]}``. 404 for an unknown conversation."""
    if bad := _methods(request, ("GET",)):
        return bad
    earlier = context.earlier_conversations(conversation_id=conversation_id)
    locale = context.conversation_locale(conversation_id=conversation_id)
    if earlier is None or locale is None:
        return _error(404, "not_found", "no such conversation")
    values = context.placeholder_values(conversation_id=conversation_id)
    return JsonResponse(
        {
            "labels": labels.conversation_label_ids(conversation_id=conversation_id),
            "earlier": earlier,
            "fill": values,
            "canned": canned.replies_filled(user=request.user, locale=locale, values=values),
        }
    )


@_agent_only
def canned_api(request: HttpRequest) -> HttpResponse:
    """``GET /console/api/canned`` -> ``{"replies": [chat.canned.reply_item...], "can_manage_shared"}``
    (shared ones and the agent's own); ``POST`` ``{"title", "text", "shortcut"?, "texts"?,
    "shared"?}`` creates one -> 201 ``{"reply"}``."""
    if bad := _methods(request, ("GET", "POST")):
        return bad
    if request.method == "GET":
        return JsonResponse(
            {"replies": canned.replies_for(request.user), "can_manage_shared": canned.can_manage_shared(request.user)}
        )
    try:
        item = canned.reply_save(user=request.user, reply_id=None, data=_body(request))
    except ChatError as e:
        return _chat_error(e)
    return JsonResponse({"reply": item}, status=201)


@_agent_only
def canned_reply_api(request: HttpRequest, reply_id: int) -> HttpResponse:
    """``POST /console/api/canned/<id>`` (same body as creating) edits a reply, ``DELETE``
    deletes it -> ``{"reply"}`` / ``{"deleted": id}``. Another agent's personal reply is 404."""
    if bad := _methods(request, ("POST", "DELETE")):
        return bad
    try:
        if request.method == "DELETE":
            canned.reply_delete(user=request.user, reply_id=reply_id)
            return JsonResponse({"deleted": reply_id})
        item = canned.reply_save(user=request.user, reply_id=reply_id, data=_body(request))
    except ChatError as e:
        return _chat_error(e)
    return JsonResponse({"reply": item})
