"""/v1/docs: Swagger UI from the site's own static files, under the site's CSP.

django-ninja's ``Swagger`` renders either its bundled copy (only with ``ninja`` in
INSTALLED_APPS) or a page loading Swagger UI from a CDN, which ``script-src 'self'``
blocks. This one serves the vendored ``swagger-ui-dist`` (static/vendor) and starts it from
a static module (static/js/api_docs.js): the CSP allows no inline script.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from ninja.openapi.docs import DocsBase

if TYPE_CHECKING:
    from ninja import NinjaAPI

SWAGGER_UI = "vendor/swagger-ui-dist-5.35.0"


@dataclass
class VendoredSwagger(DocsBase):
    """Swagger UI configuration passed to ``SwaggerUIBundle`` (``url`` is the API's document)."""

    settings: dict[str, Any] = field(
        default_factory=lambda: {
            "layout": "BaseLayout",
            "deepLinking": True,
            # The default posts the document to validator.swagger.io for a badge: nothing
            # leaves the site (and connect-src 'self' would block it anyway).
            "validatorUrl": None,
        }
    )

    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        context = {
            "title": api.title,
            "swagger_ui": SWAGGER_UI,
            "swagger_settings": {**self.settings, "url": self.get_openapi_url(api, kwargs)},
        }
        return TemplateResponse(request, "api/docs.html", context)
