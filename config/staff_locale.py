"""The staff pages' language and time zone (docs/console.md, "Language and time zone").

Staff pages (the console, its transcripts, login, the ops pages: every path under ``/console/``
and ``/ops/``) speak the agent's language: the choice the agent made with the language switch
(Django's ``set_language`` view, kept in the ``django_language`` cookie), else the browser's
Accept-Language, else ``LANGUAGE_CODE``; English and Simplified Chinese (``LANGUAGES``, locale/).
Shopper-facing pages (the storefront, the widget's socket, the gateway) keep their own ``?lang``
and the shopper's language detection: this middleware leaves them in ``LANGUAGE_CODE``.

Times on staff pages are shown in the agent's time zone: the IANA name the page's script reads
from the browser (``Intl.DateTimeFormat().resolvedOptions().timeZone``) and keeps in the
``kefu_tz`` cookie; UTC until it is known or when the name is not a time zone.
"""

from __future__ import annotations

import zoneinfo
from datetime import tzinfo

from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.middleware.locale import LocaleMiddleware
from django.utils import timezone, translation

STAFF_PREFIXES = ("/console/", "/ops/")
TIME_ZONE_COOKIE = "kefu_tz"
# IANA names are at most a few dozen characters ("America/Argentina/ComodRivadavia" is 32).
_MAX_ZONE_NAME = 64


def is_staff_path(path: str) -> bool:
    """Whether ``path`` (``request.path``) is a staff page's: under ``/console/`` or ``/ops/``."""
    return path.startswith(STAFF_PREFIXES)


def agent_time_zone(request: HttpRequest) -> tzinfo | None:
    """The time zone named by the request's ``kefu_tz`` cookie (an IANA name such as
    ``Asia/Shanghai``), or None when there is none or it names no time zone."""
    name = request.COOKIES.get(TIME_ZONE_COOKIE, "")
    if not name or len(name) > _MAX_ZONE_NAME:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # not a zone, a bad path, a directory
        return None


class StaffLocaleMiddleware(LocaleMiddleware):
    """Django's LocaleMiddleware for the staff pages only (see the module's docstring), plus the
    agent's time zone; other paths run in ``LANGUAGE_CODE`` and ``TIME_ZONE``."""

    def process_request(self, request: HttpRequest) -> None:
        if not is_staff_path(request.path):
            # Reset what an earlier request on this thread may have activated.
            translation.activate(settings.LANGUAGE_CODE)
            request.LANGUAGE_CODE = settings.LANGUAGE_CODE
            timezone.deactivate()
            return
        super().process_request(request)
        zone = agent_time_zone(request)
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if not is_staff_path(request.path):
            return response
        response = super().process_response(request, response)
        # The page is rendered: work this thread does next (a task run in place, the next request
        # before its own middleware) must not inherit the agent's language and zone.
        translation.activate(settings.LANGUAGE_CODE)
        timezone.deactivate()
        return response
