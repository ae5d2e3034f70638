"""The one reader of kefu's environment: django-environ under a wrapper that records every name read.

Every environment variable kefu reads goes through :data:`env` (``config/settings.py``, the
ASGI entry point, ``lib.native_threads``, ``lib.metrics``), per-tier names built with f-strings
included, so :func:`names_read` is the list of what the code reads. ``tests/test_configuration.py``
checks that each of them is documented in ``docs/configuration.md`` and listed in ``.env.example``.

A value that cannot be cast fails with ``ImproperlyConfigured`` naming the variable and its value
(django-environ's own message names neither).
"""

from __future__ import annotations

import builtins
import os
import threading
from typing import Any, overload
from urllib.parse import unquote, urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

_NOT_SET: Any = environ.Env.NOTSET


class RecordingEnv:
    """``environ.Env``'s typed readers (``str``, ``bool``, ``int``, ``float``, ``list``, ``json``,
    ``db_url``, ``email_url``) and :meth:`raw`, each recording the name it was asked for (whether set or not).

    Raises ``ImproperlyConfigured`` (naming the variable and its value) when a value does not
    cast, or when a variable without a default is unset.
    """

    def __init__(self) -> None:
        self._env = environ.Env()
        self._names: set[builtins.str] = set()
        self._lock = threading.Lock()

    def names_read(self) -> frozenset[builtins.str]:
        """Every name asked for since the process started."""
        with self._lock:
            return frozenset(self._names)

    def _record(self, name: builtins.str) -> None:
        with self._lock:
            self._names.add(name)

    @overload
    def raw(self, name: builtins.str) -> builtins.str | None: ...
    @overload
    def raw(self, name: builtins.str, default: builtins.str) -> builtins.str: ...
    def raw(self, name: builtins.str, default: builtins.str | None = None) -> builtins.str | None:
        """The variable's text as set (``default`` when unset), uncast."""
        self._record(name)
        return os.environ.get(name, default)

    def _cast(self, cast: builtins.str, name: builtins.str, default: Any = _NOT_SET, **kwargs: Any) -> Any:
        self._record(name)
        try:
            return getattr(self._env, cast)(name, default=default, **kwargs)
        except (ValueError, TypeError) as e:
            raise ImproperlyConfigured(
                f"environment variable {name}={os.environ.get(name)!r} is not a valid {cast}: {e}"
            ) from None
        except environ.ImproperlyConfigured as e:
            raise ImproperlyConfigured(str(e)) from None

    def str(self, name: builtins.str, default: Any = _NOT_SET) -> Any:
        """The variable as text."""
        return self._cast("str", name, default)

    def bool(self, name: builtins.str, default: Any = _NOT_SET) -> Any:
        """``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off`` (django-environ's rules)."""
        return self._cast("bool", name, default)

    def int(self, name: builtins.str, default: Any = _NOT_SET) -> Any:
        """The variable as an integer."""
        return self._cast("int", name, default)

    def float(self, name: builtins.str, default: Any = _NOT_SET) -> Any:
        """The variable as a float."""
        return self._cast("float", name, default)

    def list(self, name: builtins.str, default: Any = _NOT_SET) -> Any:
        """Comma-separated values as a list of text."""
        return self._cast("list", name, default)

    def json(self, name: builtins.str, default: Any = _NOT_SET) -> Any:
        """The variable parsed as JSON."""
        return self._cast("json", name, default)

    def json_object(self, name: builtins.str, default: dict[builtins.str, Any]) -> dict[builtins.str, Any]:
        """The variable parsed as a JSON object (``default`` when unset). Raises
        ``ImproperlyConfigured`` naming the variable when it is JSON but not an object."""
        value = self._cast("json", name, default)
        if not isinstance(value, dict):
            raise ImproperlyConfigured(f"environment variable {name}={os.environ.get(name)!r} must be a JSON object")
        return value

    def email_url(self, name: builtins.str, default: builtins.str) -> dict[builtins.str, Any]:
        """An e-mail URL in django-environ's form (``smtp+tls://user:pw@host:587``,
        ``consolemail://``, ``filemail:///absolute/dir``, ``memorymail://``...) as Django's
        ``EMAIL_*`` settings (``EMAIL_BACKEND``, ``EMAIL_HOST``, ``EMAIL_FILE_PATH``...).

        Raises ``ImproperlyConfigured`` naming the variable (its value with any password masked)
        when the scheme is unknown, the port is not a number, an SMTP URL has no host or a
        ``filemail`` URL no absolute directory."""
        self._record(name)
        raw = os.environ.get(name) or default
        parts = urlsplit(raw)
        shown = raw.replace(f":{parts.password}@", ":***@") if parts.password else raw

        def bad(why: builtins.str) -> ImproperlyConfigured:
            return ImproperlyConfigured(
                f"environment variable {name}={shown!r} is not an e-mail URL: {why} "
                "(use e.g. smtp+tls://user:password@host:587, consolemail:// or filemail:///absolute/dir)"
            )

        try:
            config: dict[builtins.str, Any] = environ.Env.email_url_config(raw)
        except (ValueError, TypeError, environ.ImproperlyConfigured) as e:
            raise bad(builtins.str(e)) from None
        backend = config.get("EMAIL_BACKEND", "")
        if backend.endswith("filebased.EmailBackend"):
            # django-environ drops the leading "/" of filemail:///dir; the directory is the path as written.
            path = unquote(parts.path)
            if parts.netloc or not path.startswith("/"):
                raise bad("filemail needs an absolute directory, three slashes: filemail:///var/mail/kefu")
            config["EMAIL_FILE_PATH"] = path
        elif backend.endswith("smtp.EmailBackend") and not config.get("EMAIL_HOST"):
            raise bad("an SMTP URL needs a host")
        return config

    def db_url(self, name: builtins.str, default: Any = _NOT_SET) -> Any:
        """A database URL as Django's ``DATABASES`` entry (django-environ's ``db_url``)."""
        return self._cast("db_url", name, default)


#: The process's one reader (see the module docstring).
env = RecordingEnv()


def names_read() -> frozenset[str]:
    """Every environment variable name :data:`env` was asked for in this process."""
    return env.names_read()
