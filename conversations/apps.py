from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "conversations"
    verbose_name = "Conversations"

    def ready(self) -> None:
        from conversations.accounts import login_throttle  # noqa: F401 - connects its signal receivers
