"""Size limits that act before an upload is read: the import view refuses an announced
length without touching the body and stops counting a file at the limit, and the server
(Daphne) answers a body over REQUEST_MAX_BODY_BYTES with a 413 before receiving it."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from conversations.models import DataJob

pytestmark = pytest.mark.django_db
IMPORT = "/settings/data/import/"


class Unreadable:
    """A request body that fails the test if anything reads it."""

    def read(self, *args):
        raise AssertionError("the request body was read")

    readline = read


def test_an_upload_announced_too_large_is_refused_without_reading_its_body(client, alice, settings):
    settings.IMPORT_MAX_BYTES = 1000
    client.force_login(alice)
    response = client.post(
        IMPORT,
        data=b"--b\r\n",
        content_type="multipart/form-data; boundary=b",
        CONTENT_LENGTH=str(1_000_000_000),
        **{"wsgi.input": Unreadable()},
    )
    assert response.status_code == 302 and response["Location"] == "/settings/data/"
    page = client.get("/settings/data/").content.decode()
    assert "Nothing was imported: the file is larger than 0.001 MB." in page
    assert not DataJob.objects.exists()


def test_a_file_is_counted_as_it_is_read_and_stopped_at_the_limit(client, alice, settings):
    settings.IMPORT_MAX_BYTES = 100  # the form's length is under the limit plus its framing
    client.force_login(alice)
    upload = SimpleUploadedFile("big.json", b"[" + b" " * 200 + b"]")
    page = client.post(IMPORT, {"file": upload}, follow=True).content.decode()
    assert "Nothing was imported: the file is larger than 0.0001 MB." in page
    assert not DataJob.objects.exists()


def test_the_import_form_still_needs_its_csrf_token(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    client.get("/settings/data/")
    upload = SimpleUploadedFile("chats.json", b"[]")
    assert client.post(IMPORT, {"file": upload}).status_code == 403
    token = client.cookies["csrftoken"].value
    upload = SimpleUploadedFile("chats.json", b"[]")
    response = client.post(IMPORT, {"file": upload, "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and DataJob.objects.filter(kind="import").count() == 1


# --- Daphne ----------------------------------------------------------------------

SERVER_LIMIT = 200_000


@pytest.fixture(scope="module")
def small_site(django_db_setup, tiny_model_dir, tmp_path_factory):
    from tests.live_site import start_live_site, stop_live_site

    site = start_live_site(
        tiny_model_dir, tmp_path_factory.mktemp("body-limit"), REQUEST_MAX_BODY_BYTES=str(SERVER_LIMIT)
    )
    yield site
    stop_live_site(site)


def connect(site) -> socket.socket:
    host, port = site.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.settimeout(5)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """The response, up to the server closing the connection."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@pytest.mark.parametrize(
    "extra, body",
    [(b"", b"--b\r\nContent-Disposition: form-data"), (b"Expect: 100-continue\r\n", b"")],
    ids=["a few bytes sent", "waiting for 100 Continue"],
)
def test_a_body_announced_too_large_is_answered_413_before_it_is_sent(small_site, extra, body):
    sock = connect(small_site)
    started = time.monotonic()
    sock.sendall(
        b"POST /settings/data/import/ HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000000000\r\n"
        + extra
        + b"\r\n"
        + body
    )
    response = read_all(sock)
    assert time.monotonic() - started < 2
    assert response.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in response
    assert b"Nothing was saved." in response and b"Connection: close" in response
    sock.close()


def test_a_chunked_body_past_the_limit_is_cut_off(small_site):
    sock = connect(small_site)
    sock.sendall(
        b"POST /settings/data/import/ HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
    sent = 0
    with pytest.raises(OSError):  # the server stops reading: a broken pipe or a reset
        while sent < 256 * 1_000_000:
            sock.sendall(chunk)
            sent += 0x10000
    # What the kernels' buffers took in after the cut, and no more.
    assert sent < SERVER_LIMIT + 32 * 1_000_000
    assert read_all(sock).startswith(b"HTTP/1.1 413 ")
    sock.close()


def test_a_body_within_the_limit_still_reaches_the_site(small_site):
    response = httpx.post(f"{small_site.url}{IMPORT}", content=b"x" * 10_000, timeout=10)
    assert response.status_code == 302 and response.headers["location"].startswith("/accounts/login/")
    assert httpx.get(f"{small_site.url}/livez", timeout=5).json() == {"status": "ok"}


def test_daphne_leaves_parsing_an_upload_to_django():
    # Twisted would otherwise parse every multipart body into request.args on the event loop,
    # a second time, blocking every other connection while it does.
    from types import SimpleNamespace

    from twisted.web.test.requesthelper import DummyChannel

    from chatsite.body_limit import CAN_SKIP_FORM_PARSING, BodyLimitedRequest

    if not CAN_SKIP_FORM_PARSING:
        pytest.skip(reason="this Twisted always parses form bodies")
    channel = DummyChannel()
    channel.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=lambda request: None))
    request = BodyLimitedRequest(channel)
    request.process = lambda: None  # Daphne's hand-over to the app is not under test here
    body = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.json"\r\n\r\n[]\r\n--b--\r\n'
    request.requestHeaders.setRawHeaders(b"Content-Type", [b"multipart/form-data; boundary=b"])
    request.gotLength(len(body))
    request.handleContentChunk(body)
    request.requestReceived(b"POST", b"/settings/data/import/", b"HTTP/1.1")
    assert request.args == {} and request.content.read() == body
