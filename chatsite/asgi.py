"""ASGI entry point: HTTP to Django, websockets through auth and an origin check."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

from chatsite.service_checks import exit_if_unreachable  # noqa: E402

exit_if_unreachable()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

from chatsite.body_limit import install as limit_request_bodies  # noqa: E402

# Daphne receives a whole body before calling the app: this refuses oversized ones first.
limit_request_bodies(settings.REQUEST_MAX_BODY_BYTES)

django_asgi_app = get_asgi_application()

from conversations.chat.routing import websocket_urlpatterns  # noqa: E402

router = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)


async def application(scope, receive, send):
    # The first request of any kind starts this loop's generation manager, so that with
    # several processes this one advertises itself (and fails over dead ones' answers)
    # before its first websocket arrives. Daphne has no startup hook to do it earlier.
    if scope["type"] != "lifespan":
        from conversations.chat.manager import get_manager

        get_manager()
    return await router(scope, receive, send)


if settings.ENGINE_PRELOAD:
    from conversations.ops.engine_handle import preload_engine

    # Load the model in the background so the first message doesn't wait for it.
    preload_engine()
