"""ASGI entry point: HTTP to Django, websockets through auth and an origin check; under
Daphne, a bounded shutdown on SIGTERM (``conversations.ops.shutdown``)."""

import asyncio
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

from chatsite.service_checks import exit_if_unreachable  # noqa: E402

exit_if_unreachable()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from chatsite.autobahn_logs import install as defer_websocket_debug_logs  # noqa: E402
from chatsite.body_limit import install as limit_request_bodies  # noqa: E402
from chatsite.eager_writes import install as send_writes_at_once  # noqa: E402
from chatsite.module_proxies import install as skip_module_proxies  # noqa: E402
from chatsite.sqlite_statements import install as keep_sqlite_placeholders  # noqa: E402
from chatsite.websocket_frames import install as frame_text_at_once  # noqa: E402

if settings.GIL_SWITCH_INTERVAL_MS > 0:
    sys.setswitchinterval(settings.GIL_SWITCH_INTERVAL_MS / 1000)
# Daphne receives a whole body before calling the app: this refuses oversized ones first.
limit_request_bodies(settings.REQUEST_MAX_BODY_BYTES)
defer_websocket_debug_logs()
send_writes_at_once()
skip_module_proxies()
frame_text_at_once()
keep_sqlite_placeholders()

from conversations.ops.asgi_handler import site_asgi_application  # noqa: E402

django_asgi_app = site_asgi_application()

from conversations.accounts.socket_auth import socket_auth_stack  # noqa: E402
from conversations.api.handler import ApiHandler, is_api_call  # noqa: E402
from conversations.chat.routing import websocket_urlpatterns  # noqa: E402

# The JSON API skips the browser middleware and the thread per request (see its module).
api_asgi_app = ApiHandler()

router = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(socket_auth_stack(URLRouter(websocket_urlpatterns))),
    }
)


# HTTP requests being served, for the shutdown to see them finish.
_requests: set[asyncio.Task] = set()


async def application(scope, receive, send):
    # The first request of any kind starts this loop's generation manager, so that with
    # several processes this one advertises itself (and fails over dead ones' answers)
    # before its first websocket arrives. Daphne has no startup hook to do it earlier.
    if scope["type"] != "lifespan":
        from conversations.chat.manager import get_manager

        get_manager()
    if scope["type"] != "http":
        return await router(scope, receive, send)
    # At shutdown Daphne cancels the application, but Django's handler leaves the request's
    # own task running, its view in a thread that needs this loop again to finish; should
    # the loop stop first, that thread waits for it for ever. Shielded, the request is seen
    # to its end before the loop stops.
    app = api_asgi_app if is_api_call(scope) else router
    request = asyncio.ensure_future(app(scope, receive, send))
    _requests.add(request)
    request.add_done_callback(_requests.discard)
    return await asyncio.shield(request)


if settings.ENGINE_PRELOAD or settings.ENGINE_MODELS_LOAD == "start":
    from conversations.ops.engine_handle import preload_engine_or_exit

    preload_engine_or_exit()


def _shut_down_with_daphne() -> None:
    """Daphne runs Twisted's reactor, which handles SIGTERM and SIGINT: its "before shutdown"
    triggers run on the event loop while it still runs, and the shutdown waits for the
    Deferred they return. Other hosts (the tests' in-process application) have no reactor."""
    if "twisted.internet.reactor" not in sys.modules:
        return
    from twisted.internet import defer, reactor

    from conversations.ops.shutdown import shut_down

    def trigger() -> defer.Deferred:
        loop = asyncio.get_event_loop()  # the reactor's own: this runs in one of its callbacks
        stopping = shut_down(settings.SHUTDOWN_TIMEOUT_SECONDS, requests=lambda: list(_requests))
        return defer.Deferred.fromFuture(loop.create_task(stopping))

    reactor.addSystemEventTrigger("before", "shutdown", trigger)


_shut_down_with_daphne()

# Served by the daphne command (its CLI loaded this module): full garbage collections wait for
# the engine to be idle. Tests that import this module keep CPython's schedule.
if settings.GC_FULL_MAX_INTERVAL_S > 0 and "daphne.cli" in sys.modules:
    from conversations.ops.idle_collector import start_idle_collector

    start_idle_collector(settings.GC_FULL_MAX_INTERVAL_S)
