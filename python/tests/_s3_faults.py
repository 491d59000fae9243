"""A fault-injecting HTTP proxy for the S3 tests: threads on loopback in front of a moto server (_s3_server), forwarding
every request as it came (headers, signature and body untouched) unless a rule says otherwise. Point
``AWS_ENDPOINT_URL`` (or ``S3Storage(endpoint=...)``) at ``proxy.endpoint``.

A rule matches requests by method, S3 operation and key, and then, for its first ``times`` matches after ``skip``:

- ``fail``: answers HTTP ``status`` with an S3 error document (``<Code>InternalError</Code>``; 503 ``SlowDown`` is
  S3's throttling) without forwarding;
- ``drop_request``: reads half the request body (the upload is under way), then closes the connection, no answer;
- ``cut_response``: forwards, then sends the status, the headers and half the body, and closes the connection;
- ``stall``: holds the request without reading it for ``seconds`` (or until the proxy stops), then closes;
- ``call``: runs ``hook()`` (e.g. kill the server), then goes on as if no rule had matched.

``rate`` (bytes per second) makes the proxy a link of that speed, shared by every connection: request bodies
(uploads) and response bodies (downloads) pass it in turn (benchmarks of what a slow link to S3 costs).

``proxy.log`` lists what happened: (method, operation, key, what), what being the status forwarded or the rule's
action.
"""

from __future__ import annotations

import http.client
import http.server
import socketserver
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

#: S3 operations by method and query (what a rule's `op` names).
OPERATIONS = (
    ("POST", "uploads", "create_upload"),
    ("PUT", "partNumber", "upload_part"),
    ("POST", "uploadId", "complete_upload"),
    ("DELETE", "uploadId", "abort_upload"),
    ("GET", "list-type", "list"),
    ("GET", "uploads", "list_uploads"),
)


def operation(method: str, query: dict, key: str) -> str:
    """The S3 operation a request is: create_upload, upload_part, complete_upload, abort_upload, list, put, get,
    head, delete, or the method in lower case for the rest."""
    for m, q, name in OPERATIONS:
        if method == m and q in query:
            return name
    if not key and method == "GET":
        return "list"
    return {"PUT": "put", "GET": "get", "HEAD": "head", "DELETE": "delete"}.get(method, method.lower())


@dataclass
class Rule:
    action: str  # "fail", "drop_request", "cut_response", "stall" or "call"
    op: Optional[str] = None  # an operation() name; None: any
    key_contains: Optional[str] = None
    key_excludes: Optional[str] = None
    times: Optional[int] = None  # fires this many times (None: every time)
    skip: int = 0  # lets this many matching requests through first
    status: int = 500
    code: str = "InternalError"
    seconds: float = 3600.0
    hook: Optional[Callable[[], None]] = None
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def take(self, op: str, key: str) -> bool:
        """Whether the rule fires for this request (counts it)."""
        if self.op is not None and op != self.op:
            return False
        if self.key_contains is not None and self.key_contains not in key:
            return False
        if self.key_excludes is not None and self.key_excludes in key:
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


def fail(status: int = 500, code: str = "InternalError", **match) -> Rule:
    return Rule("fail", status=status, code=code, **match)


def throttle(**match) -> Rule:
    """S3's answer to too many requests: 503 SlowDown."""
    return Rule("fail", status=503, code="SlowDown", **match)


def drop_request(**match) -> Rule:
    return Rule("drop_request", **match)


def cut_response(**match) -> Rule:
    return Rule("cut_response", **match)


def stall(seconds: float = 3600.0, **match) -> Rule:
    return Rule("stall", seconds=seconds, **match)


def call(hook: Callable[[], None], **match) -> Rule:
    return Rule("call", hook=hook, **match)


class _Link:
    """A link of `rate` bytes per second shared by every connection: pass(n) returns once n bytes had their turn."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.free_at = time.monotonic()

    def pass_bytes(self, n: int) -> None:
        with self.lock:
            start = max(time.monotonic(), self.free_at)
            self.free_at = done = start + n / self.rate
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and Expect: 100-continue answered as S3 does
    server: "_Server"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def _any(self) -> None:
        proxy = self.server.proxy
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        parts = url.path.lstrip("/").split("/", 1)  # path style: /bucket/key
        key = parts[1] if len(parts) > 1 else ""
        op = operation(self.command, query, key)
        rule = proxy.match(op, key)
        action = rule.action if rule else "forward"
        if action == "call":
            rule.hook()
            action = "forward"
        if action == "stall":
            proxy.record(self.command, op, key, "stall")
            proxy.stopping.wait(rule.seconds)
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length") or 0)
        if action == "drop_request":
            self.rfile.read(length // 2)
            proxy.record(self.command, op, key, "drop_request")
            self.close_connection = True
            return
        body = self._body(length)
        if proxy.link is not None and body:
            proxy.link.pass_bytes(len(body))
        if action == "fail":
            proxy.record(self.command, op, key, f"fail {rule.status}")
            doc = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{rule.code}</Code><Message>injected by the '
                f"test proxy</Message><Resource>/{key}</Resource><RequestId>0</RequestId></Error>"
            ).encode()
            self.send_response(rule.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(doc)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(doc)
            return
        try:
            status, reason, headers, data = proxy.forward(self.command, self.path, self.headers, body)
        except OSError:  # the server is gone: so is the connection
            proxy.record(self.command, op, key, "server unreachable")
            self.close_connection = True
            return
        cut = action == "cut_response" and len(data) > 1
        proxy.record(self.command, op, key, "cut_response" if cut else status)
        self.send_response(status, reason)
        for k, v in headers:
            if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                self.send_header(k, v)
        declared = int(dict((k.lower(), v) for k, v in headers).get("content-length", len(data)))
        self.send_header("Content-Length", str(declared if self.command == "HEAD" else len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if proxy.link is None:
            self.wfile.write(data)
            return
        view = memoryview(data)
        for at in range(0, len(view), 256 << 10):
            piece = view[at : at + (256 << 10)]
            proxy.link.pass_bytes(len(piece))
            self.wfile.write(piece)

    def _body(self, length: int) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(length) if length else b""

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: "FaultProxy"


class FaultProxy:
    """The proxy, serving from construction until stop() (also a context manager)."""

    def __init__(self, upstream: str, rules: Optional[List[Rule]] = None, rate: Optional[float] = None) -> None:
        target = urllib.parse.urlsplit(upstream)
        self.link = _Link(rate) if rate else None
        self.upstream = (target.hostname, target.port)
        self.rules: List[Rule] = list(rules or [])
        self.log: List[Tuple[str, str, str, object]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    def match(self, op: str, key: str) -> Optional[Rule]:
        with self.lock:
            for rule in self.rules:
                if rule.take(op, key):
                    return rule
        return None

    def record(self, method: str, op: str, key: str, what: object) -> None:
        with self.lock:
            self.log.append((method, op, key, what))

    def count(self, op: Optional[str] = None, what: object = None) -> int:
        """Requests logged for operation `op` (None: any) that ended in `what` (None: anything)."""
        with self.lock:
            return sum(1 for _, o, _, w in self.log if (op is None or o == op) and (what is None or w == what))

    def forward(self, method: str, path: str, headers, body: bytes) -> Tuple[int, str, list, bytes]:
        """Sends the request to the server as it came (Host header included: signatures cover it)."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers.items():
                if k.lower() in _HOP_BY_HOP or k.lower() in ("content-length", "expect"):
                    continue
                conn.putheader(k, v)
            if body or method in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
