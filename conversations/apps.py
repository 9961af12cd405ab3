from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "conversations"
    verbose_name = "Conversations"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from conversations.accounts import login_throttle  # noqa: F401 - connects its signal receivers
        from conversations.ops import files

        # SQLite databases created outside settings (Django's test databases) are private too.
        connection_created.connect(files.on_connection_created, dispatch_uid="conversations.private_sqlite")
