"""The password hasher of the test process: Django's PBKDF2 with 1,000 rounds instead of
1,000,000 (about half a second of CPU per hash on this kind of machine, paid by every
``make_user``, password sign-in and refused sign-in's dummy hash).

It keeps the algorithm's name and format (``pbkdf2_sha256$<rounds>$<salt>$<hash>``), and
PBKDF2 verifies with the rounds a hash records, so the live sites that tests start (with the
real settings) accept these passwords, and re-hash them at full strength on sign-in as they
would any outdated hash."""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
