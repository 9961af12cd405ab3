"""Start and stop the test identity provider as its own process, and change its users."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.processes import stop_process, wait_until_answering

ROOT = Path(__file__).resolve().parents[3]
CLIENT_ID = "chatsite-test"
CLIENT_SECRET = "chatsite-test-secret"  # noqa: S105 - the test provider's own client


@dataclass
class Provider:
    url: str
    issuer: str
    process: subprocess.Popen
    env: dict[str, str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def set_active(self, username: str, active: bool) -> None:
        """Deactivate (or reactivate) a user at the provider, from another process on its database."""
        code = (
            "import django; django.setup();"
            "from django.contrib.auth.models import User;"
            f"User.objects.filter(username={username!r}).update(is_active={active!r})"
        )
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=self.env, check=True)


def rsa_key_pem() -> str:
    from jwcrypto import jwk

    return jwk.JWK.generate(kty="RSA", size=2048).export_to_pem(private_key=True, password=None).decode()


def start_provider(port: int, workdir: Path, redirect_uri: str, users: list[dict]) -> Provider:
    setup = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uri": redirect_uri,
        "users": users,
    }
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.oidc_provider.settings",
        "PROVIDER_DB": str(workdir / "provider.sqlite3"),
        "PROVIDER_RSA_KEY": rsa_key_pem(),
        "PROVIDER_SETUP": json.dumps(setup),
    }
    for name in ("DATABASE_URL", "REDIS_URL", "SQLITE_PATH"):
        env.pop(name, None)
    log_path = workdir / "provider.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.oidc_provider.serve", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    provider = Provider(url=url, issuer=f"{url}/o", process=process, env=env, log_path=log_path)
    discovery = f"{provider.issuer}/.well-known/openid-configuration"
    wait_until_answering(
        process,
        lambda: httpx.get(discovery, timeout=2).status_code == 200,
        name="the provider",
        log=provider.log,
        seconds=60,
        interval=0.3,
        stop_timeout=10,
    )
    return provider


def stop_provider(provider: Provider) -> None:
    stop_process(provider.process, 10)
