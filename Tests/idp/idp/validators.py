"""DOT's OAuth2Validator plus the pieces Tessera's tests need that DOT lacks."""
import base64
import json
import time
import uuid

from django.conf import settings
from oauth2_provider.oauth2_validators import OAuth2Validator

from idp.middleware import current_request

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
_OID_NAMESPACE = uuid.UUID("0b8a5d0e-7a1c-4a44-9d8e-4e7c1b2f0a11")


def object_id(user):
    """The user's stable object id (Entra's oid), a UUID derived from the username."""
    return str(uuid.uuid5(_OID_NAMESPACE, user.username))


def client_info(user):
    """Entra's client_info: base64url (unpadded) of JSON {"uid": oid, "utid": tid}."""
    raw = json.dumps({"uid": object_id(user), "utid": settings.TENANT}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class TesseraValidator(OAuth2Validator):
    # Claim -> scope that releases it. preferred_username/tid/oid ride on openid (as the
    # broker needs a username to show); name needs profile, email needs email.
    oidc_claim_scope = {
        **OAuth2Validator.oidc_claim_scope,
        "preferred_username": "openid",
        "tid": "openid",
        "oid": "openid",
    }

    def get_additional_claims(self):
        # Request-agnostic form (values are callables) so discovery lists these claims.
        return {
            "preferred_username": lambda r: r.user.username,
            "name": lambda r: r.user.get_full_name() or r.user.username,
            "given_name": lambda r: r.user.first_name,
            "family_name": lambda r: r.user.last_name,
            "email": lambda r: r.user.email,
            "email_verified": lambda r: bool(r.user.email),
            "tid": lambda r: settings.TENANT,
            "oid": lambda r: object_id(r.user),
        }

    # --- prompt=none: oauthlib calls these; DOT does not implement them (HTTP 500). ---
    def validate_silent_login(self, request):
        django_request = current_request()
        return bool(django_request and django_request.user.is_authenticated)

    def validate_silent_authorization(self, request):
        # Only apps that never show a consent screen can be authorized silently.
        return bool(getattr(request.client, "skip_authorization", False))

    # --- device grant: oauthlib skips the OIDC token modifiers, so no id_token. ---
    # --- client_info=1 in a token request: Entra answers client_info (MSAL and Tessera's
    #     Microsoft mode name the home account "uid.utid" from it). ---
    def _save_bearer_token(self, token, request, *args, **kwargs):
        super()._save_bearer_token(token, request, *args, **kwargs)
        django_request = current_request()
        asked = django_request is not None and django_request.method == "POST" and (
            django_request.POST.get("client_info") == "1")
        if asked and getattr(request, "user", None) is not None:
            token["client_info"] = client_info(request.user)
        if request.grant_type == DEVICE_GRANT and "openid" in (request.scopes or []):
            # token is the dict oauthlib serialises next, so this lands in the response.
            id_token = {"aud": request.client_id, "iat": int(time.time())}
            token["id_token"] = self.finalize_id_token(id_token, token, None, request)
