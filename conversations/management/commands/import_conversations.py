"""``python manage.py import_conversations USERNAME FILE``: our JSON export or ChatGPT's
``conversations.json`` (told apart by shape), all or nothing. ``-`` reads stdin."""

from __future__ import annotations

import sys

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from conversations.transfer import InvalidFile, parse_file
from conversations.transfer.importing import save


class Command(BaseCommand):
    help = "Import conversations for a user from a chatsite JSON export or ChatGPT's conversations.json."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("file", help="The file to read, or - for stdin.")

    def handle(self, *args, username: str, file: str, **options) -> None:
        try:
            kind, specs = parse_file(self._read(file))
        except InvalidFile as exc:
            raise CommandError(f"{file}: nothing was imported: {exc}") from None
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        ids = save(user, specs)
        source = "ChatGPT" if kind == "chatgpt" else "chatsite"
        self.stdout.write(
            f"Imported {len(ids)} conversation(s), {sum(len(s.nodes) for s in specs)} message(s) "
            f"from a {source} file for {username}."
        )

    def _read(self, file: str) -> bytes:
        limit = settings.IMPORT_MAX_BYTES
        try:
            if file == "-":
                return sys.stdin.buffer.read(limit + 1)
            with open(file, "rb") as handle:
                return handle.read(limit + 1)  # one byte over is enough to say it is too big
        except OSError as exc:
            raise CommandError(f"{file}: cannot read it ({exc.strerror}).") from None
