"""``manage.py create_agent USERNAME [--name NAME] [--password PW | --password-stdin]``

Creates (or updates) a staff user who may use the agent console: ``is_staff`` and a member of
the ``Agents`` group, which holds the ``chat.handle_conversations`` permission. Without a
password option it asks for one twice on the terminal. Admins can make more agents in
``/admin/`` by adding staff users to the ``Agents`` group.
"""

from __future__ import annotations

import getpass
import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

AGENTS_GROUP = "Agents"


def agents_group() -> Group:
    """The ``Agents`` group with the console permission (created on first use)."""
    group, _ = Group.objects.get_or_create(name=AGENTS_GROUP)
    group.permissions.add(Permission.objects.get(content_type__app_label="chat", codename="handle_conversations"))
    return group


class Command(BaseCommand):
    help = "Create or update an agent of the console (a staff user in the Agents group)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="display name shoppers see (default: the username)")
        parser.add_argument("--email", default="")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--password", help="the password (visible in the shell history; see --password-stdin)")
        group.add_argument(
            "--password-stdin", action="store_true", help="read the password from the first line of stdin"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        if not username:
            raise CommandError("the username is blank")
        password = options["password"]
        if options["password_stdin"]:
            password = sys.stdin.readline().rstrip("\n")
        elif password is None:
            password = getpass.getpass("Password: ")
            if password != getpass.getpass("Password (again): "):
                raise CommandError("the passwords differ")
        if not password:
            raise CommandError("the password is blank")
        User = get_user_model()
        with transaction.atomic():
            user, created = User.objects.get_or_create(username=username)
            user.is_staff = True
            user.is_active = True
            if options["name"]:
                user.first_name = options["name"][:150]
            if options["email"]:
                user.email = options["email"]
            user.set_password(password)
            user.save()
            user.groups.add(agents_group())
        verb = "created" if created else "updated"
        self.stdout.write(f"agent {username!r} {verb}; sign in at /console/login/")
