"""/v1/docs renders in Debian's Chromium from the site's own files, under the site's CSP."""

from __future__ import annotations

import json

import pytest

from tests.chat.test_browser import CHROMIUM_ARGS

# Collects what the page's CSP blocks, whether or not Chromium also logs it.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(`${event.violatedDirective}: ${event.blockedURI}`);
});
"""


def test_the_openapi_document_has_no_duplicate_keys_and_documents_both_200_bodies(client):
    """Swagger UI parses the document as YAML, which rejects a key given twice (Python's json
    keeps the last one silently)."""

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict:
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys in {keys}"
        return dict(pairs)

    document = json.loads(client.get("/v1/openapi.json").content, object_pairs_hook=no_duplicates)
    for path in ("/v1/chat/completions", "/v1/completions"):
        ok = document["paths"][path]["post"]["responses"]["200"]
        assert set(ok["content"]) == {"application/json", "text/event-stream"}
        assert "server-sent events" in ok["description"]


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_api_docs_page_lists_the_operations_from_vendored_assets_under_the_sites_csp(live_site):
    from django.conf import settings
    from playwright.sync_api import expect, sync_playwright

    url = live_site.url
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            context.set_default_timeout(30_000)
            context.add_init_script(RECORD_VIOLATIONS)
            page = context.new_page()
            errors: list[str] = []
            requests: list[str] = []
            page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
            page.on("console", lambda msg: msg.type == "error" and errors.append(f"console: {msg.text}"))
            page.on("request", lambda request: requests.append(request.url))

            response = page.goto(f"{url}/v1/docs")
            assert response.status == 200
            assert response.headers["content-security-policy"] == settings.CONTENT_SECURITY_POLICY
            # The first render parses the whole document: allow a busy machine its time.
            expect(page.get_by_text("/v1/chat/completions", exact=True)).to_be_visible(timeout=30_000)
            expect(page.get_by_text("/v1/completions", exact=True)).to_be_visible()
            expect(page.get_by_role("button", name="Authorize")).to_be_visible()

            assert page.evaluate("window.__cspViolations") == []
            assert errors == []
            assert all(r.startswith(f"{url}/") for r in requests), requests
            assert f"{url}/static/vendor/swagger-ui-dist-5.35.0/swagger-ui-bundle.js" in requests
        finally:
            browser.close()
