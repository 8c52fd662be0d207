"""One MSAL Python operation through its Linux broker (pymsalruntime -> D-Bus
com.microsoft.identity.broker1), as a real app would do it. Run with the MSAL venv's python
(scripts/msal setup), one process per operation:

    msal_client.py '{"op": "interactive", "login_hint": "alice@example.test"}'

Prints one JSON object on stdout: {"op", "ok", "result"?, "accounts"?, "error"?}. MSAL's and
msalruntime's debug log goes to $TESSERA_MSAL_LOG (a file) when set, else nowhere.

Command keys (all optional except op):
  op           interactive | silent | accounts | remove | version
  authority    default $TESSERA_IDP_AUTHORITY      client_id  default "tessera-test"
  scopes       default ["read"] (MSAL adds openid, profile, offline_access itself)
  login_hint   interactive: the user (browser.py signs in as that user)
  prompt       interactive: passed to MSAL
  account      silent/remove: an account dict as a previous run printed it ("accounts" or
               result["account"]); MSAL needs home_account_id, local_account_id, username,
               environment, and account_source "broker"
  username     silent/remove: pick the account of MSAL's cache with that username instead
  force_refresh  silent: skip MSAL's own access-token cache
  cache        path of a SerializableTokenCache file to load and save (default: none, so MSAL's
               own in-memory cache starts empty and every answer comes through the broker)
"""
import json
import logging
import os
import sys
import time

sys.dont_write_bytecode = True


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def setup_logging():
    path = os.environ.get("TESSERA_MSAL_LOG")
    if not path:
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)


def account_view(acc):
    keys = ("home_account_id", "local_account_id", "username", "environment", "realm", "account_source",
            "authority_type")
    return {k: acc.get(k) for k in keys if k in acc}


def result_view(result):
    """The result without MSAL's telemetry; tokens stay in (test tokens from the test IdP)."""
    if result is None:
        return None
    out = {k: v for k, v in result.items() if not k.startswith("_msalruntime")}
    return out


def main():
    raw = sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read()
    cmd = json.loads(raw)
    op = cmd["op"]
    setup_logging()
    log = logging.getLogger("msal_client")
    log.debug("command %s", json.dumps({k: v for k, v in cmd.items() if k != "account"}))

    import requests

    import msal

    ca = os.environ.get("TESSERA_IDP_CA") or os.environ.get("REQUESTS_CA_BUNDLE")
    http = requests.Session()
    http.trust_env = False  # no proxies; the namespace has loopback only
    if ca:
        http.verify = ca

    cache = msal.SerializableTokenCache()
    cache_path = cmd.get("cache")
    if cache_path and os.path.exists(cache_path):
        with open(cache_path) as f:
            cache.deserialize(f.read())

    started = time.monotonic()
    app = msal.PublicClientApplication(
        cmd.get("client_id", "tessera-test"),
        authority=cmd.get("authority") or os.environ["TESSERA_IDP_AUTHORITY"],
        enable_broker_on_linux=True,
        instance_discovery=False,
        http_client=http,
        token_cache=cache,
    )
    out = {"op": op, "broker_enabled": bool(getattr(app, "_enable_broker", False))}
    if not out["broker_enabled"]:
        out.update(ok=False, error="MSAL did not enable its broker (pymsalruntime could not initialise)")
        emit(out)
        return 3
    scopes = cmd.get("scopes", ["read"])

    def pick_account():
        if cmd.get("account"):
            return dict(cmd["account"])
        name = cmd.get("username")
        for acc in app.get_accounts(username=name) if name else app.get_accounts():
            return acc
        return None

    if op == "interactive":
        kwargs = {"login_hint": cmd.get("login_hint"),
                  "parent_window_handle": app.CONSOLE_WINDOW_HANDLE}
        if cmd.get("prompt"):
            kwargs["prompt"] = cmd["prompt"]
        result = app.acquire_token_interactive(scopes, **kwargs)
    elif op == "silent":
        account = pick_account()
        if account is None:
            out.update(ok=False, error="no account to use (pass account or username)")
            emit(out)
            return 2
        result = app.acquire_token_silent_with_error(scopes, account, force_refresh=bool(cmd.get("force_refresh")))
    elif op == "accounts":
        result = {}
    elif op == "remove":
        account = pick_account()
        if account is None:
            out.update(ok=False, error="no account to remove (pass account or username)")
            emit(out)
            return 2
        app.remove_account(account)
        result = {}
    elif op == "version":
        import pymsalruntime
        result = {"pymsalruntime": getattr(pymsalruntime, "__version__", None), "msal": msal.__version__}
    else:
        out.update(ok=False, error=f"unknown op {op!r}")
        emit(out)
        return 2

    out["seconds"] = round(time.monotonic() - started, 3)
    out["result"] = result_view(result)
    out["ok"] = bool(result is not None and "error" not in result)
    if result and "error" in result:
        out["error"] = result["error"]
    if result and result.get("id_token_claims"):
        out["username"] = result["id_token_claims"].get("preferred_username")
    out["accounts"] = [account_view(a) for a in app.get_accounts()]
    if cache_path and cache.has_state_changed:
        with open(cache_path, "w") as f:
            f.write(cache.serialize())
    emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
