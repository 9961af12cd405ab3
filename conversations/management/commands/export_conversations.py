"""``python manage.py export_conversations USERNAME [--format json|markdown] [--conversation ID]``:
a user's conversations (or one) on stdout."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from conversations.models import Conversation
from conversations.transfer.jobs import render_export


class Command(BaseCommand):
    help = "Write a user's conversations to stdout: JSON (every branch) or Markdown (the shown threads)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--format", choices=["json", "markdown"], default="json")
        parser.add_argument("--conversation", type=int, help="Only this conversation (an id of theirs).")

    def handle(self, *args, username: str, format: str, conversation: int | None, **options) -> None:
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        if conversation is not None and not Conversation.objects.filter(pk=conversation, owner=user).exists():
            raise CommandError(f"{username} has no conversation {conversation}.")
        body = render_export(user, format, conversation_id=conversation)
        self.stdout.write(body.decode(), ending="\n")
