"""The import form's size limit, applied before its file is read whole.

``announced_size`` is the request's Content-Length, which the view checks before anything
touches the body; ``ImportSizeLimit`` counts the file's bytes as Django parses the form and
stops the parse at the limit, for a body whose length was not announced or was wrong.
(Daphne has already received the body by then, up to ``REQUEST_MAX_BODY_BYTES``: see
``chatsite.body_limit``.)
"""

from __future__ import annotations

from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest


def announced_size(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class ImportSizeLimit(FileUploadHandler):
    """First of the request's upload handlers: passes each chunk on to the next (memory or
    temporary file) until the files' bytes pass ``max_bytes``, then stops the upload."""

    def __init__(self, request: HttpRequest, max_bytes: int) -> None:
        super().__init__(request)
        self.max_bytes = max_bytes
        self.received = 0
        self.refused = False

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self.max_bytes:
            self.refused = True
            # Not a connection reset: the rest of the body is read and dropped, so the
            # client still gets the page saying why.
            raise StopUpload(connection_reset=False)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handler makes the file
