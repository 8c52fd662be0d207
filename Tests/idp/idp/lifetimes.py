"""Per-client access-token lifetimes (plain Python: imported by settings.py)."""

DEFAULT_ACCESS_TOKEN_SECONDS = 3600
# client_id -> access-token lifetime in seconds
ACCESS_TOKEN_SECONDS = {"tessera-short": 3, "tessera-soak": 120}


def access_token_expires_in(request):
    """oauthlib's BearerToken calls this per token; its result is both the response's
    expires_in and (via DOT's _save_bearer_token) the stored expiry, so the two agree."""
    client_id = getattr(getattr(request, "client", None), "client_id", None) or getattr(
        request, "client_id", None
    )
    return ACCESS_TOKEN_SECONDS.get(client_id, DEFAULT_ACCESS_TOKEN_SECONDS)
