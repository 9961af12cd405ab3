"""``python manage.py create_api_key USERNAME [--name NAME]``: prints the new key alone on its last line."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from conversations.audit.log import Action, record
from conversations.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key for a user. The key is printed once, alone on the last line; only its hash is stored."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="A label to tell the key apart later.")

    def handle(self, *args, username: str, name: str, **options) -> None:
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist as exc:
            raise CommandError(f"No user named {username!r}.") from exc
        if not user.is_active:
            raise CommandError(f"The user {username!r} is inactive.")
        with transaction.atomic():
            key, raw = ApiKey.objects.create_key(user, name=name[:100])
            record(Action.API_KEY_CREATE, target=key, detail={"via": "manage.py", "for": username})
        self.stderr.write(f"Created API key {key.prefix}… for {username}. It is shown once; store it now.")
        self.stdout.write(raw)
