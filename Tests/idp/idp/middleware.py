"""Request log (one JSON line per request) and a per-thread handle on the current request."""
import json
import os
import threading
import time

_local = threading.local()


def current_request():
    """The Django request being served on this thread (for oauthlib hooks that lack it)."""
    return getattr(_local, "request", None)


class RequestLogMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        _local.request = request
        started = time.time()
        try:
            response = self.get_response(request)
        finally:
            _local.request = None
        self._log(request, response.status_code, started)
        return response

    @staticmethod
    def _log(request, status, started):
        path = os.environ.get("TESSERA_IDP_LOG")
        if not path:
            return
        is_token = request.method == "POST" and request.path.endswith("/o/token/")
        # Only these fields: never codes, tokens, passwords, or query strings.
        client_id = request.POST.get("client_id") if request.method == "POST" else None
        client_id = client_id or request.GET.get("client_id")
        line = json.dumps(
            {
                "t": started,
                "method": request.method,
                "path": request.path,
                "status": status,
                "grant_type": request.POST.get("grant_type") if is_token else None,
                "client_id": client_id,
                # How a confidential client sent its secret (never the secret): for the providers'
                # client_secret_basic and client_secret_post.
                "client_auth": "basic" if request.META.get("HTTP_AUTHORIZATION", "").startswith("Basic ")
                else "post" if request.method == "POST" and request.POST.get("client_secret") else None,
            }
        )
        with open(path, "a") as f:  # one write per line: lines from threads never interleave
            f.write(line + "\n")
