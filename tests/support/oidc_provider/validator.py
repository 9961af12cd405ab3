"""The provider's claims: the user's name, e-mail and Django groups (as the ``groups`` claim);
and a refresh refused for a deactivated user, as identity providers do."""

from __future__ import annotations

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    # Every claim whatever the scopes asked (the site asks for "openid email profile").
    oidc_claim_scope = None

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    def validate_refresh_token(self, refresh_token, client, request, *args, **kwargs):
        valid = super().validate_refresh_token(refresh_token, client, request, *args, **kwargs)
        return valid and request.user is not None and request.user.is_active

    def validate_bearer_token(self, token, scopes, request):
        valid = super().validate_bearer_token(token, scopes, request)
        return valid and request.user is not None and request.user.is_active
