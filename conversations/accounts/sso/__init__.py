"""Single sign-on with the organisation's OpenID Connect provider, through mozilla-django-oidc:
discovery of the provider's endpoints from its issuer URL (``discovery``), the authentication
backend that maps claims to users and groups (``backend``), the sign-in views with pages for
the provider's errors (``views``), and the refresh that signs out users the provider no longer
accepts (``refresh``)."""
