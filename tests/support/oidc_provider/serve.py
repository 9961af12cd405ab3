"""``python -m tests.support.oidc_provider.serve PORT``: migrate the provider's database, make
its client (the site) and users from ``PROVIDER_SETUP`` (JSON), then serve on 127.0.0.1:PORT.

``PROVIDER_SETUP``: ``{"client_id", "client_secret", "redirect_uri", "users": [{"username",
"password", "email", "groups": [...]}]}``.
"""

from __future__ import annotations

import json
import os
import sys

import django


def setup_data(spec: dict) -> None:
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    Application.objects.update_or_create(
        client_id=spec["client_id"],
        defaults={
            "name": "chatsite",
            "client_secret": spec["client_secret"],
            "client_type": Application.CLIENT_CONFIDENTIAL,
            "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
            "redirect_uris": spec["redirect_uri"],
            "algorithm": Application.RS256_ALGORITHM,
            "skip_authorization": True,
        },
    )
    for data in spec.get("users", []):
        user, _ = User.objects.get_or_create(username=data["username"])
        user.email = data.get("email", "")
        user.is_active = data.get("active", True)
        user.set_password(data["password"])
        user.save()
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in data.get("groups", [])])


def main() -> None:
    port = int(sys.argv[1])
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.oidc_provider.settings"
    django.setup()
    from django.core.management import call_command
    from django.core.servers.basehttp import run
    from django.core.wsgi import get_wsgi_application

    call_command("migrate", verbosity=0)
    setup_data(json.loads(os.environ.get("PROVIDER_SETUP", "{}")))
    print(f"provider ready on {port}", flush=True)
    run("127.0.0.1", port, get_wsgi_application(), threading=True)


if __name__ == "__main__":
    main()
