from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "conversations"
    verbose_name = "Conversations"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_delete

        from conversations.accounts import login_throttle  # noqa: F401 - connects its signal receivers
        from conversations.audit import receivers as audit_receivers
        from conversations.chat.kv_purge import user_deleted
        from conversations.ops import db_thread, files

        # SQLite databases created outside settings (Django's test databases) are private too.
        connection_created.connect(files.on_connection_created, dispatch_uid="conversations.private_sqlite")
        # The thread of the websocket's database calls keeps its connection.
        connection_created.connect(db_thread.on_connection_created, dispatch_uid="conversations.db_thread")
        # A deleted user's KV blocks leave every engine's tiers.
        audit_receivers.connect()
        post_delete.connect(user_deleted, sender=settings.AUTH_USER_MODEL, dispatch_uid="kv-purge-user")
