"""A fault-injecting HTTPS reverse proxy between tesserad and the test IdP (issue 12, part 3).

tesserad is configured with the proxy as its authority (`https://127.0.0.1:PORT/<tenant>`); the
proxy terminates TLS with the test IdP's own server certificate (so tesserad trusts it through
the session's ca_file) and forwards every request to the real IdP. For tesserad the proxy *is*
the identity provider, so the proxy makes the IdP's answers consistent with its own address:

- the IdP's origin (`https://127.0.0.1:IDP_PORT`) becomes the proxy's in JSON and HTML bodies and
  in `Location` headers, plain and percent-encoded: the discovery document's issuer and
  endpoints, and the `iss` of the sign-in redirect (RFC 9207);
- an id_token in a token response gets the proxy's issuer as `iss` and is signed again with the
  IdP's own signing key (`$TESSERA_IDP_DIR/oidc-key.pem`, same `kid`), so it validates against
  the IdP's JWKS, which passes through unchanged.

Faults are set from the test, in process (`proxy.fault(...)`), and are injected from outside the
daemon: nothing in tesserad knows about them. Connection-level faults hit every connection (TLS
comes before the path is known): `refuse` (nothing listens on the port), `black_hole` (the TCP
connection is accepted and then nothing is ever said, not even the TLS handshake) and
`wrong_cert` (a self-signed certificate no CA vouches for). Request-level faults hit requests whose
endpoint matches (`token`, `discovery`, `jwks`, `authorize`, `device`, `revoke`, or a path fragment
starting with "/"):

  reset        a response head announcing a body, half of it, then a TCP reset
  no_answer    the request is read and never answered
  trickle      the response is sent one byte every `interval` seconds
  status       HTTP `status` (500, 502, 503, 429...), with `retry_after` if given
  garbage      HTTP 200, Content-Type application/json, a body that is not JSON
  huge         HTTP 200 with a JSON body of `size` bytes (10 MB by default)
  drop_fields  the IdP's real answer without the JSON fields `fields`
  foreign_key  the IdP's real answer with its id_token signed by a key the IdP never published

The first six answer in the IdP's place: the request never reaches the IdP (so a refresh token
sent with it is not rotated there). `drop_fields` and `foreign_key` change the IdP's real answer:
the IdP did serve the request. A fault may be limited to its first `count` matching requests.

Every request is recorded (monotonic time, method, path, endpoint, fault, status, whether it was
forwarded), and every token, code and secret that passes through is collected, so a test can check
Retry-After was honoured and that no secret reached the daemon's log.
"""
import base64
import datetime
import http.client
import json
import os
import socket
import ssl
import struct
import threading
import time
from urllib.parse import parse_qsl, quote, urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
              "content-length", "accept-encoding"}
CONNECTION_FAULTS = {"refuse", "black_hole", "wrong_cert"}
REQUEST_FAULTS = {"reset", "no_answer", "trickle", "status", "garbage", "huge", "drop_fields", "foreign_key"}
SECRET_FIELDS = ("access_token", "refresh_token", "id_token", "code", "code_verifier", "device_code")


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Fault:
    def __init__(self, mode, endpoint=None, count=None, **params):
        assert mode in CONNECTION_FAULTS | REQUEST_FAULTS, mode
        assert (mode in CONNECTION_FAULTS) == (endpoint is None), "request faults need an endpoint, others none"
        self.mode = mode
        self.endpoint = endpoint
        self.count = count
        self.params = params
        self.hits = 0

    def __repr__(self):
        extra = "".join(f" {k}={v}" for k, v in self.params.items())
        return f"<{self.mode}{' at ' + self.endpoint if self.endpoint else ''}{extra}>"


class FaultProxy:
    def __init__(self, upstream, tenant, ca_file, cert_file, key_file, signing_key_file):
        self.upstream = upstream.rstrip("/")
        parts = urlsplit(self.upstream)
        self.upstream_host, self.upstream_port = parts.hostname, parts.port or 443
        self.upstream_context = ssl.create_default_context(cafile=ca_file)
        self.context = self._server_context(cert_file, key_file)
        self._signing_key_file = signing_key_file
        self._signing_key = None
        self._foreign_key = None
        self._wrong_context = None
        self.lock = threading.Lock()
        self.faults = []
        self.records = []
        self.secrets = set()
        self.connections = set()
        self.listener = None
        self.closed = False
        self.port = self._listen(0)
        self.url = f"https://127.0.0.1:{self.port}"
        self._paths = self._endpoint_paths(tenant)
        self.authority = f"{self.url}/{tenant}"

    # -- Control (the test's side) -------------------------------------------------------------

    def fault(self, mode, endpoint=None, count=None, **params):
        """Injects a fault (replacing any other on the same endpoint); returns it."""
        f = Fault(mode, endpoint, count, **params)
        with self.lock:
            self.faults = [x for x in self.faults if x.endpoint != endpoint]
            self.faults.append(f)
        if mode in CONNECTION_FAULTS:
            # Connections already open (libcurl keeps them alive) must not get around the fault.
            self._drop_connections()
            if mode == "refuse":
                self._close_listener()
        return f

    def clear(self):
        """No fault any more; the proxy listens on the same port again."""
        with self.lock:
            had = [f.mode for f in self.faults]
            self.faults = []
        self._drop_connections()
        if "refuse" in had:
            self._listen(self.port)

    def mark(self):
        with self.lock:
            return len(self.records)

    def requests(self, since=0, endpoint=None):
        """Recorded requests after `since` (a mark), optionally of one endpoint."""
        with self.lock:
            return [r for r in self.records[since:] if endpoint is None or r["endpoint"] == endpoint]

    def close(self):
        self.closed = True
        self._close_listener()
        self._drop_connections()

    # -- Listening ---------------------------------------------------------------------------------

    def _listen(self, port):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        self.listener = s
        threading.Thread(target=self._accept_loop, args=(s,), daemon=True).start()
        return s.getsockname()[1]

    def _close_listener(self):
        s, self.listener = self.listener, None
        if s is not None:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept_loop(self, listener):
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _drop_connections(self):
        with self.lock:
            conns, self.connections = list(self.connections), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                c.close()
            except OSError:
                pass

    def _connection_fault(self):
        with self.lock:
            return next((f for f in self.faults if f.mode in CONNECTION_FAULTS), None)

    def _request_fault(self, endpoint, path):
        with self.lock:
            for f in self.faults:
                if f.mode in CONNECTION_FAULTS:
                    continue
                if f.endpoint.startswith("/") and f.endpoint not in path:
                    continue
                if not f.endpoint.startswith("/") and f.endpoint != endpoint:
                    continue
                if f.count is not None and f.hits >= f.count:
                    continue
                f.hits += 1
                return f
        return None

    # -- One connection ----------------------------------------------------------------------------

    def _serve(self, raw):
        conn = raw
        try:
            fault = self._connection_fault()
            if fault is not None and fault.mode == "black_hole":
                self._hold(raw)
                return
            context = self._wrong_cert_context() if fault is not None and fault.mode == "wrong_cert" else self.context
            raw.settimeout(30)
            try:
                conn = context.wrap_socket(raw, server_side=True)  # takes raw's descriptor over
            except (ssl.SSLError, OSError):
                return  # the client refused the certificate (wrong_cert), or went away
            with self.lock:
                self.connections.discard(raw)
                self.connections.add(conn)
            reader = conn.makefile("rb")
            while not self.closed:
                request = self._read_request(reader)
                if request is None or not self._handle(conn, request):
                    return
        except (OSError, ssl.SSLError, ValueError):
            return
        finally:
            with self.lock:
                self.connections.discard(raw)
                self.connections.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def _hold(self, sock):
        """Says nothing until the fault is cleared or the client gives up."""
        sock.settimeout(0.2)
        while not self.closed:
            fault = self._connection_fault()
            if fault is None or fault.mode != "black_hole":
                return
            try:
                if sock.recv(4096) == b"":
                    return
            except socket.timeout:
                continue
            except OSError:
                return

    @staticmethod
    def _read_request(reader):
        line = reader.readline(65537)
        if not line:
            return None
        method, target, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        headers = []
        while True:
            h = reader.readline(65537).decode("latin-1")
            if h in ("\r\n", "\n", ""):
                break
            name, _, value = h.partition(":")
            headers.append((name.strip(), value.strip()))
        length = int(next((v for n, v in headers if n.lower() == "content-length"), "0"))
        body = reader.read(length) if length else b""
        return {"method": method, "target": target, "headers": headers, "body": body}

    def endpoint_of(self, path):
        for name, known in self._paths.items():
            if path == known:
                return name
        if path.endswith("/.well-known/openid-configuration"):
            return "discovery"
        return "other"

    def _handle(self, conn, request):
        """Answers one request; returns whether the connection stays open."""
        path = urlsplit(request["target"]).path
        endpoint = self.endpoint_of(path)
        fault = self._request_fault(endpoint, path)
        record = {"t": time.monotonic(), "method": request["method"], "path": path, "endpoint": endpoint,
                  "fault": fault.mode if fault else None, "forwarded": False, "status": None}
        with self.lock:
            self.records.append(record)
        self._collect_request_secrets(request)
        mode = fault.mode if fault else None

        if mode == "no_answer":
            self._hold_request(conn, fault)
            return False
        if mode in ("reset", "trickle", "status", "garbage", "huge"):
            status, headers, body = self._made_up_answer(fault, endpoint)
            record["status"] = status
            data = self._response_bytes(status, headers, body)
            if mode == "reset":
                conn.sendall(data[:len(data) - len(body) // 2])
                self._reset(conn)
                return False
            if mode == "trickle":
                interval = fault.params.get("interval", 1.0)
                for i in range(len(data)):
                    if self._fault_gone(fault):
                        conn.sendall(data[i:])
                        break
                    conn.sendall(data[i:i + 1])
                    time.sleep(interval)
                return False
            try:
                conn.sendall(data)
            except OSError:
                return False  # e.g. the client refused a huge body halfway
            return True

        status, headers, body = self._forward(request)
        record["forwarded"] = True
        record["status"] = status
        headers, body = self._rewrite(path, request["method"], status, headers, body, fault)
        conn.sendall(self._response_bytes(status, headers, body))
        return not any(n.lower() == "connection" and v.lower() == "close" for n, v in request["headers"])

    def _fault_gone(self, fault):
        with self.lock:
            return fault not in self.faults

    def _hold_request(self, conn, fault):
        conn.settimeout(0.2)
        while not self.closed and not self._fault_gone(fault):
            try:
                if conn.recv(4096) == b"":
                    return
            except (socket.timeout, ssl.SSLWantReadError):
                continue
            except OSError:
                return

    @staticmethod
    def _reset(conn):
        """Closes with a TCP RST (SO_LINGER 0), without a TLS close_notify (Python's close sends none)."""
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        conn.close()

    # -- Answers -----------------------------------------------------------------------------------

    @staticmethod
    def _made_up_answer(fault, endpoint):
        mode, p = fault.mode, fault.params
        json_type = [("Content-Type", "application/json")]
        if mode == "status":
            status = p["status"]
            headers = [("Content-Type", "text/html")]
            if p.get("retry_after") is not None:
                headers.append(("Retry-After", str(p["retry_after"])))
            body = p.get("body", f"<html><body><h1>{status}</h1>The server is not available.</body></html>").encode()
            return status, headers, body
        if mode == "garbage":
            return 200, json_type, b'{"access_token": "abc", "token_type": <this is not JSON>\x00\xff'
        if mode == "huge":
            size = p.get("size", 10 * 1024 * 1024)
            return 200, json_type, b'{"padding": "' + b"A" * (size - 15) + b'"}'
        # reset and trickle send something plausible (it never arrives whole).
        if endpoint == "token":
            body = {"access_token": "made-up-" + "x" * 40, "token_type": "Bearer", "expires_in": 3600}
        else:
            body = {"note": "a document that never arrives whole", "padding": "x" * 400}
        return 200, json_type, json.dumps(body).encode()

    @staticmethod
    def _response_bytes(status, headers, body):
        reason = http.client.responses.get(status, "Status")
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{n}: {v}" for n, v in headers if n.lower() not in HOP_BY_HOP]
        lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def _forward(self, request):
        up = http.client.HTTPSConnection(self.upstream_host, self.upstream_port, context=self.upstream_context,
                                         timeout=60)
        try:
            headers = {}
            for n, v in request["headers"]:
                if n.lower() not in HOP_BY_HOP:
                    headers[n] = v
            headers["Content-Length"] = str(len(request["body"]))
            up.request(request["method"], request["target"], body=request["body"] or None, headers=headers)
            resp = up.getresponse()
            body = resp.read()
            return resp.status, resp.getheaders(), body
        finally:
            up.close()

    def _origin_pairs(self):
        return [(self.upstream, self.url), (quote(self.upstream, safe=""), quote(self.url, safe="")),
                (self.upstream.replace("/", "\\/"), self.url.replace("/", "\\/"))]

    def rewrite_text(self, text):
        for old, new in self._origin_pairs():
            text = text.replace(old, new)
        return text

    def _rewrite(self, path, method, status, headers, body, fault):
        out = []
        content_type = ""
        for n, v in headers:
            if n.lower() == "location":
                v = self.rewrite_text(v)
            if n.lower() == "content-type":
                content_type = v.lower()
            out.append((n, v))
        if any(t in content_type for t in ("json", "html", "text")):
            text = self.rewrite_text(body.decode("utf-8"))
            if "json" in content_type and status == 200 and self.endpoint_of(path) == "token":
                text = self._rewrite_token_response(text, fault)
            body = text.encode("utf-8")
        return out, body

    def _rewrite_token_response(self, text, fault):
        answer = json.loads(text)
        for field in SECRET_FIELDS:
            if isinstance(answer.get(field), str):
                with self.lock:
                    self.secrets.add(answer[field])
        if "id_token" in answer:
            answer["id_token"] = self._resign(answer["id_token"], foreign=fault is not None and fault.mode == "foreign_key")
            with self.lock:
                self.secrets.add(answer["id_token"])
        if fault is not None and fault.mode == "drop_fields":
            for field in fault.params["fields"]:
                answer.pop(field, None)
        return json.dumps(answer)

    def _collect_request_secrets(self, request):
        kind = next((v for n, v in request["headers"] if n.lower() == "content-type"), "")
        if "x-www-form-urlencoded" not in kind:
            return
        for name, value in parse_qsl(request["body"].decode("utf-8", "replace")):
            if name in SECRET_FIELDS and value:
                with self.lock:
                    self.secrets.add(value)

    # -- id_tokens -----------------------------------------------------------------------------------

    def _resign(self, token, foreign):
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        header_b64, payload_b64, _ = token.split(".")
        header = json.loads(b64url_decode(header_b64))
        claims = json.loads(b64url_decode(payload_b64))
        claims["iss"] = self.rewrite_text(claims["iss"])
        if foreign:
            key = self._foreign_signing_key()
            header["kid"] = "never-published-" + b64url(os.urandom(6))
        else:
            key = self._idp_signing_key()
            header_b64 = None  # keep the IdP's header as it was
        h = header_b64 or b64url(json.dumps(header, separators=(",", ":")).encode())
        signing_input = f"{h}.{b64url(json.dumps(claims, separators=(',', ':')).encode())}".encode()
        signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        return signing_input.decode() + "." + b64url(signature)

    def _idp_signing_key(self):
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        if self._signing_key is None:
            with open(self._signing_key_file, "rb") as f:
                self._signing_key = load_pem_private_key(f.read(), password=None)
        return self._signing_key

    def _foreign_signing_key(self):
        from cryptography.hazmat.primitives.asymmetric import rsa
        if self._foreign_key is None:
            self._foreign_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return self._foreign_key

    # -- TLS ---------------------------------------------------------------------------------------

    @staticmethod
    def _server_context(cert_file, key_file):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def _wrong_cert_context(self):
        """A certificate for 127.0.0.1 that no CA vouches for (self-signed, made here)."""
        if self._wrong_context is None:
            import ipaddress
            import tempfile

            from cryptography import x509
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import rsa
            from cryptography.x509.oid import NameOID

            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
            now = datetime.datetime.now(datetime.timezone.utc)
            cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                    .serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
                    .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                                x509.DNSName("localhost")]), critical=False)
                    .sign(key, hashes.SHA256()))
            with tempfile.TemporaryDirectory() as d:
                cert_path, key_path = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
                with open(cert_path, "wb") as f:
                    f.write(cert.public_bytes(serialization.Encoding.PEM))
                with open(key_path, "wb") as f:
                    f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
                self._wrong_context = self._server_context(cert_path, key_path)
        return self._wrong_context

    # -- Endpoints -----------------------------------------------------------------------------------

    def _endpoint_paths(self, tenant):
        """Paths of the IdP's endpoints, from its discovery document."""
        tenant_paths = {}
        up = http.client.HTTPSConnection(self.upstream_host, self.upstream_port, context=self.upstream_context,
                                         timeout=30)
        try:
            up.request("GET", f"/{tenant}/.well-known/openid-configuration")
            doc = json.loads(up.getresponse().read())
        finally:
            up.close()
        for name, key in [("token", "token_endpoint"), ("jwks", "jwks_uri"), ("authorize", "authorization_endpoint"),
                          ("device", "device_authorization_endpoint"), ("revoke", "revocation_endpoint")]:
            if doc.get(key):
                tenant_paths[name] = urlsplit(doc[key]).path
        return tenant_paths


def start_proxy(idp_url, tenant, idp_dir):
    """A FaultProxy in front of the test IdP at idp_url (authority idp_url/tenant) whose state
    (certificates, signing key) is in idp_dir (scripts/idp start)."""
    return FaultProxy(idp_url, tenant, os.path.join(idp_dir, "ca.pem"), os.path.join(idp_dir, "server.pem"),
                      os.path.join(idp_dir, "server-key.pem"), os.path.join(idp_dir, "oidc-key.pem"))
