"""Servers the integration tests own, each accepting only a valid access token from the test IdP
(checked at the IdP's userinfo endpoint on every request): a git smart-HTTP server (git
http-backend behind HTTPS), a Kubernetes API stub, a /me API, and an SMTP server that takes AUTH
XOAUTH2 and OAUTHBEARER (aiosmtpd). ConnectProxy and server_cert let them answer for a real host
name (dev.azure.com), as the documentation's commands name them (test_docs.py)."""
import base64
import http.server
import json
import os
import socketserver
import ssl
import subprocess
import threading
import urllib.error
import urllib.request

from conftest import IDP_DIR, IDP_URL, TENANT

USERINFO = f"{IDP_URL}/{TENANT}/o/userinfo/"
CA = os.path.join(IDP_DIR, "ca.pem")


def token_user(token):
    """The username the IdP says the token is for, or None when the IdP refuses it."""
    if not token:
        return None
    request = urllib.request.Request(USERINFO, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=CA), timeout=10) as r:
            info = json.load(r)
    except urllib.error.HTTPError:
        return None
    return info.get("preferred_username") or info.get("sub")


def bearer_or_basic(header):
    """The token from an Authorization header: Bearer T, or Basic with T as the password."""
    if not header:
        return None, None
    kind, _, value = header.partition(" ")
    if kind.lower() == "bearer":
        return "bearer", value.strip()
    if kind.lower() == "basic":
        try:
            _, _, password = base64.b64decode(value).decode().partition(":")
        except Exception:  # noqa: BLE001
            return "basic", None
        return "basic", password
    return kind, None


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class HTTPSResource:
    """An HTTPS server on 127.0.0.1 with the IdP's certificate (the test CA). Subclasses answer
    authorized requests in `serve(handler, user)`. Every request is recorded as
    (method, path, auth kind, user or None, status)."""

    def __init__(self, cert=None):
        """cert: (certificate, key) files; default the IdP's (127.0.0.1, localhost). server_cert()
        makes one for other names (dev.azure.com) from the test CA."""
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                kind, token = bearer_or_basic(self.headers.get("Authorization"))
                user = token_user(token)
                if user is None:
                    outer.requests.append((self.command, self.path, kind, None, 401))
                    body = b"a valid access token from the test IdP is required\n"
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="tessera-test"')
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                status = outer.serve(self, user)
                outer.requests.append((self.command, self.path, kind, user, status))

            do_GET = do_POST = handle_any

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*(cert or (os.path.join(IDP_DIR, "server.pem"), os.path.join(IDP_DIR, "server-key.pem"))))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def serve(self, handler, user):
        raise NotImplementedError

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class GitServer(HTTPSResource):
    """git's smart HTTP protocol through `git http-backend` (CGI), for the repositories under root."""

    def __init__(self, root, cert=None):
        self.root = root
        super().__init__(cert)

    def serve(self, handler, user):
        path, _, query = handler.path.partition("?")
        length = int(handler.headers.get("Content-Length") or 0)
        return git_http_backend(handler, self.root, user, path, query, handler.rfile.read(length) if length else b"")


def git_http_backend(handler, root, user, path, query, body):
    """Answers a git smart-HTTP request of `user` (already authorized) through `git http-backend`
    (CGI) for the repositories under root; returns the status."""
    env = {
        "PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": root, "GIT_HTTP_EXPORT_ALL": "1",
        "REQUEST_METHOD": handler.command, "PATH_INFO": path, "QUERY_STRING": query,
        "CONTENT_TYPE": handler.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
        "REMOTE_USER": user, "REMOTE_ADDR": "127.0.0.1",
        "HTTP_GIT_PROTOCOL": handler.headers.get("Git-Protocol", ""),
    }
    if handler.headers.get("Content-Encoding"):
        env["HTTP_CONTENT_ENCODING"] = handler.headers["Content-Encoding"]
    out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60).stdout
    head, _, payload = out.partition(b"\r\n\r\n")
    status = 200
    headers = []
    for line in head.decode().split("\r\n"):
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        elif name:
            headers.append((name, value.strip()))
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)
    return status


def seeded_repository(path, work):
    """A bare repository at `path` that takes pushes over HTTP, with one commit (a README) made in
    `work`."""
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", path], check=True)
    subprocess.run(["git", "-C", path, "config", "http.receivepack", "true"], check=True)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "init", "-q", "-b", "main", work], check=True)
    with open(os.path.join(work, "README"), "w") as f:
        f.write("hello\n")
    subprocess.run(["git", "-C", work, "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", work, "commit", "-qm", "seed"], check=True, env=env)
    subprocess.run(["git", "-C", work, "push", "-q", path, "main"], check=True, env=env)


def send_json(handler, value):
    """Answers 200 with `value` as JSON; returns the status, as serve() does."""
    body = json.dumps(value).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
    return 200


class KubeAPI(HTTPSResource):
    """Enough of a Kubernetes API server for `kubectl get --raw`: a pod list naming the user."""

    def serve(self, handler, user):
        return send_json(handler, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                   "items": [{"metadata": {"name": f"pod-of-{user}"}}]})


class UserAPI(HTTPSResource):
    """A JSON API in the manner of Microsoft Graph's /me: who the token is for, and the path asked."""

    def serve(self, handler, user):
        return send_json(handler, {"userPrincipalName": user, "path": handler.path})


def server_cert(directory, names):
    """A server certificate for `names` (DNS names) signed by the test CA, as (cert, key) paths: a
    test server can then stand in for a real host (dev.azure.com) that git or curl reach through
    ConnectProxy, with nothing but the CA (GIT_SSL_CAINFO, CURL_CA_BUNDLE) to trust."""
    os.makedirs(directory, exist_ok=True)
    cert, key, csr, ext = (os.path.join(directory, n) for n in ("cert.pem", "key.pem", "cert.csr", "cert.ext"))
    with open(ext, "w") as f:
        f.write("subjectAltName=" + ",".join(f"DNS:{n}" for n in names) + "\nextendedKeyUsage=serverAuth\n")
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={names[0]}", "-keyout", key,
                    "-out", csr], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", CA, "-CAkey", os.path.join(IDP_DIR, "ca-key.pem"),
                    "-CAcreateserial", "-CAserial", os.path.join(directory, "ca.srl"), "-days", "2",
                    "-extfile", ext, "-out", cert], check=True, capture_output=True)
    return cert, key


class ConnectProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 (for https_proxy) that tunnels `routes` ({"host:443":
    local port}) to test servers on 127.0.0.1 and refuses every other target: a command that names
    dev.azure.com or graph.microsoft.com reaches a test server as written. `connects` records the
    targets asked for."""

    def __init__(self, routes):
        import socket
        self.routes = dict(routes)
        self.connects = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    def _tunnel(self, conn):
        import socket
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split() + ["", ""]
            self.connects.append(target)
            port = self.routes.get(target) if method == "CONNECT" else None
            if port is None:
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            with socket.create_connection(("127.0.0.1", port)) as upstream:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                upstream.sendall(head.split(b"\r\n\r\n", 1)[1])

                def pipe(src, dst):
                    try:
                        while data := src.recv(65536):
                            dst.sendall(data)
                    except OSError:
                        pass
                    finally:
                        try:
                            dst.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass

                back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
                back.start()
                pipe(conn, upstream)
                back.join(60)

    def close(self):
        self.sock.close()


class SMTPServer:
    """aiosmtpd on 127.0.0.1 that accepts AUTH XOAUTH2 and OAUTHBEARER only with a token the IdP
    accepts for the user named in the response; messages and auth attempts are recorded."""

    def __init__(self):
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult

        outer = self
        self.messages = []
        self.auth = []  # (mechanism, user, accepted)

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                outer.messages.append((envelope.mail_from, envelope.rcpt_tos, envelope.content))
                return "250 OK"

            def _check(self, mechanism, user, token):
                ok = user is not None and token_user(token) == user
                outer.auth.append((mechanism, user, ok))
                return AuthResult(success=ok, handled=False)

            async def _initial(self, server, args):
                if len(args) > 1:
                    return base64.b64decode(args[1])
                return await server.challenge_auth("", encode_to_b64=False)

            async def auth_XOAUTH2(self, server, args):
                raw = await self._initial(server, args)
                fields = dict(f.split("=", 1) for f in raw.decode().split("\x01") if "=" in f)
                token = fields.get("auth", "").removeprefix("Bearer ")
                return self._check("XOAUTH2", fields.get("user"), token)

            async def auth_OAUTHBEARER(self, server, args):
                raw = await self._initial(server, args)
                gs2, _, rest = raw.decode().partition("\x01")
                user = next((p[2:] for p in gs2.split(",") if p.startswith("a=")), None)
                if user:
                    user = user.replace("=2C", ",").replace("=3D", "=")
                fields = dict(f.split("=", 1) for f in rest.split("\x01") if "=" in f)
                return self._check("OAUTHBEARER", user, fields.get("auth", "").removeprefix("Bearer "))

        def refuse_others(server, session, envelope, mechanism, auth_data):
            return AuthResult(success=False, handled=False)

        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, auth_require_tls=False,
                                     authenticator=refuse_others, auth_exclude_mechanism=["LOGIN", "PLAIN"])
        self.controller.start()

    def close(self):
        self.controller.stop()
