"""Deployment checks of ops (``manage.py check --deploy``; registered by ``ops.apps.OpsConfig``).

``kefu.W001``-``kefu.W003``: the reverse proxy's request body limit, as declared in
``KEFU_PROXY_MAX_BODY_BYTES`` (the value of nginx's ``client_max_body_size``). kefu refuses a body
over its own limits before reading it (``config.body_limit``), but a proxy with no limit, or a
large one, buffers the whole body first (nginx to memory and disk) and then sends it to kefu.
The sound range is from the largest body kefu accepts (the gateway's
``KEFU_GATEWAY_MAX_BODY_BYTES``, Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``) up to
:data:`PROXY_BODY_BOUND_BYTES`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register

#: The largest proxy body limit the check accepts, bytes (10 MiB): four times Django's own 2.5 MB
#: default and ten times the gateway's 1 MB; a chat request is a few kilobytes.
PROXY_BODY_BOUND_BYTES = 10 * 1024 * 1024


def largest_app_body_bytes() -> int:
    """The largest request body kefu itself accepts on some path, bytes."""
    limits = [int(settings.KEFU_GATEWAY_MAX_BODY_BYTES)]
    if settings.DATA_UPLOAD_MAX_MEMORY_SIZE is not None:
        limits.append(int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
    return max(limits)


@register(Tags.security, deploy=True)
def proxy_body_limit(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``kefu.W001`` unset, ``kefu.W002`` above :data:`PROXY_BODY_BOUND_BYTES`, ``kefu.W003`` below
    what kefu accepts (the proxy would refuse requests kefu serves, with its own HTML page)."""
    declared = int(settings.KEFU_PROXY_MAX_BODY_BYTES)
    where = "docs/security.md, 'Request bodies'"
    if declared <= 0:
        return [
            Warning(
                "The reverse proxy's request body limit is not declared (KEFU_PROXY_MAX_BODY_BYTES).",
                hint=f"Limit bodies at the proxy (nginx: client_max_body_size 3m;) and set "
                f"KEFU_PROXY_MAX_BODY_BYTES to that value in bytes; see {where}.",
                id="kefu.W001",
            )
        ]
    if declared > PROXY_BODY_BOUND_BYTES:
        return [
            Warning(
                f"The reverse proxy accepts request bodies of {declared} bytes "
                f"(KEFU_PROXY_MAX_BODY_BYTES), over {PROXY_BODY_BOUND_BYTES}: it buffers such a body whole.",
                hint=f"Lower the proxy's limit (nginx client_max_body_size) and this setting; see {where}.",
                id="kefu.W002",
            )
        ]
    largest = largest_app_body_bytes()
    if declared < largest:
        return [
            Warning(
                f"The reverse proxy refuses bodies over {declared} bytes (KEFU_PROXY_MAX_BODY_BYTES), "
                f"below the {largest} bytes kefu accepts: those requests get the proxy's page, not kefu's JSON 413.",
                hint=f"Raise the proxy's limit to at least {largest} bytes, or lower kefu's; see {where}.",
                id="kefu.W003",
            )
        ]
    return []
