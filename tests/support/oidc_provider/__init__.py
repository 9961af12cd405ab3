"""A small OpenID Connect provider for the single sign-on tests: django-oauth-toolkit with OIDC
on, its own SQLite database, run as its own process on a free port (``serve``). Nothing in it
reaches the network beyond 127.0.0.1."""
