#!/usr/bin/env python3
"""Sample provisioning helper as a webhook: plain (jwt) enrollment over HTTP.

Set the provisioner's `helper` to this server's URL and `helper_secret_file` to the file named by
HELPER_SECRET_FILE here. The provisioner POSTs each server's details as JSON (the very bytes a
command helper reads on stdin) and reads the server's configuration as JSON from the answer.
Every request is signed: X-Choria-Provisioner-Signature-V2 is "sha256=" and the hex
HMAC-SHA256, keyed with the shared secret, of the line "v2 request" and then the
X-Choria-Provisioner-Timestamp value, the X-Choria-Provisioner-Request-Id value and the body,
each framed as its length in decimal, ":", the bytes and a newline (docs/helper.md). A request
that is unsigned, signed with another secret, more than five minutes away from this clock, or
carrying a request id already seen in that window (a replay) is answered 401 and nothing is done
for it. Every answer to a request that passed is signed in turn, in
X-Choria-Provisioner-Reply-Signature over the line "v2 reply", the request id and the answer's
body, so the provisioner can be set to refuse replies that are not (helper_reply_signature:
required).

Everything in the body comes from the server, that is from anyone holding a provisioning JWT:
the identity is checked against the provisioner's grammar before anything else, and the one
inventory fact used (the role) is only ever compared with a fixed value.

Python's standard library only. For https, run it behind a TLS-terminating proxy or wrap the
socket with the ssl module.

Settings come from the environment:
  CHORIA_BROKERS      comma separated broker URLs for the provisioned servers (required)
  HELPER_SECRET_FILE  the file holding the secret shared with the provisioner (required)
  HELPER_LISTEN       address:port to listen on (default 127.0.0.1:8080)
"""
import hashlib
import heapq
import hmac
import http.server
import json
import os
import re
import sys
import threading
import time

# The provisioner's identity grammar: labels of ASCII letters, digits, '-' and '_', 1 to 63
# bytes each, separated by single dots, at most 253 bytes in all. Use fullmatch: with match and
# a closing $, Python also accepts a trailing newline.
IDENTITY = re.compile(r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*")
MAX_BODY = 1024 * 1024
MAX_SKEW = 300
# Request ids are remembered while their timestamp is in the window; only signed requests are
# remembered, so only the provisioner can fill this, and a full set refuses rather than forgets.
MAX_REMEMBERED = 100000
TIMESTAMP = re.compile(r"[0-9]{1,12}")
REQUEST_ID = re.compile(r"[0-9a-f]{32}")


def identity_problem(identity):
    """Why this identity must not be used, or None when it is a plain DNS-like name."""
    if not isinstance(identity, str):
        return "the identity is not a string"
    if len(identity) > 253:
        return "the identity is longer than 253 bytes"
    if not IDENTITY.fullmatch(identity):
        return ("the identity is not a DNS-like name (labels of letters, digits, '-' and '_', "
                "1 to 63 bytes, separated by single dots)")
    if identity.lower().endswith((".mcollective", ".choria")):
        return "the identity is a Choria client name (*.mcollective, *.choria)"
    return None


def framed(first_line, *fields):
    """The signed message: the first line, then each field as its length, ':', itself and a newline.

    The lengths keep the fields apart whatever bytes they hold (version 1 joined them with dots,
    which could move from one field to the next)."""
    return first_line + b"".join(b"%d:%s\n" % (len(f), f) for f in fields)


def sign(secret, message):
    return "sha256=" + hmac.new(secret, message, hashlib.sha256).hexdigest()


class SeenIds:
    """The request ids accepted recently, each until its timestamp leaves the window."""

    def __init__(self, capacity):
        self.lock = threading.Lock()
        self.ids = set()
        self.by_time = []  # a heap of (timestamp, request id)
        self.capacity = capacity

    def admit(self, request_id, timestamp, now):
        """None when the id is new (it is remembered); else the status and why it is refused."""
        with self.lock:
            while self.by_time and self.by_time[0][0] + MAX_SKEW < now:
                self.ids.discard(heapq.heappop(self.by_time)[1])
            if request_id in self.ids:
                return 401, "replayed request"
            if len(self.ids) >= self.capacity:
                return 503, "too many requests to remember; try again later"
            self.ids.add(request_id)
            heapq.heappush(self.by_time, (timestamp, request_id))
            return None


def one_header(headers, name):
    """The header's one value, or None when it is absent or given more than once."""
    values = headers.get_all(name) or []
    return values[0] if len(values) == 1 else None


def signature_problem(secret, headers, body, seen):
    """Why the request is not a new one from the provisioner: (status, why), or None."""
    timestamp = one_header(headers, "X-Choria-Provisioner-Timestamp") or ""
    request_id = one_header(headers, "X-Choria-Provisioner-Request-Id") or ""
    signature = one_header(headers, "X-Choria-Provisioner-Signature-V2") or ""
    now = int(time.time())
    if not TIMESTAMP.fullmatch(timestamp) or abs(now - int(timestamp)) > MAX_SKEW:
        return 401, "missing or stale timestamp"
    if not REQUEST_ID.fullmatch(request_id):
        return 401, "missing or malformed request id"
    expected = sign(secret, framed(b"v2 request\n", timestamp.encode(), request_id.encode(), body))
    # Constant time, on bytes: the header arrives decoded as Latin-1.
    if not hmac.compare_digest(expected.encode(), signature.encode("latin-1")):
        return 401, "bad signature"
    # Remembered only once the signature holds, so nobody else can fill the set.
    return seen.admit(request_id, int(timestamp), now)


def facts_of(inventory_text):
    """The server's facts, or {} when the inventory is not the shape expected."""
    try:
        inventory = json.loads(inventory_text) if isinstance(inventory_text, str) else None
    except (ValueError, RecursionError):
        return {}
    facts = inventory.get("facts") if isinstance(inventory, dict) else None
    return facts if isinstance(facts, dict) else {}


def reply_for(node, brokers):
    """The reply for one server: a configuration, or a defer naming why not."""
    if not isinstance(node, dict):
        return {"defer": True, "msg": "the input is not a JSON object"}
    problem = identity_problem(node.get("identity"))
    if problem:
        return {"defer": True, "msg": "refused: " + problem}
    identity = node["identity"]
    config = {
        "identity": identity,
        "plugin.choria.server.provision": "false",
        "plugin.choria.middleware_hosts": brokers,
        "plugin.choria.use_srv": "false",
        "loglevel": "info",
    }
    if facts_of(node.get("inventory")).get("role") == "web":
        config["classesfile"] = "/etc/choria/classes.txt"
    return {"configuration": config, "msg": "configured by webhook-plain.py"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the provisioner reuses its connections

    def answer(self, status, document, request_id=None):
        """Sends the answer; for a request that passed, signed over its id and these bytes."""
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if request_id is not None:
            signature = sign(SECRET, framed(b"v2 reply\n", request_id.encode(), data))
            self.send_header("X-Choria-Provisioner-Reply-Signature", signature)
        self.end_headers()
        self.wfile.write(data)

    def read_body(self):
        length = self.headers.get("Content-Length", "0")
        if not re.fullmatch(r"[0-9]{1,8}", length) or int(length) > MAX_BODY:
            self.close_connection = True
            return None
        return self.rfile.read(int(length))

    def checked_body(self):
        """(body, request id) when the request is a new one signed with our secret; else
        answers and returns None."""
        body = self.read_body()
        if body is None:
            self.answer(413, {"msg": "the body is too large"})
            return None
        problem = signature_problem(SECRET, self.headers, body, SEEN)
        if problem:
            status, why = problem
            self.answer(status, {"msg": why})
            return None
        return body, self.headers["X-Choria-Provisioner-Request-Id"]

    def do_GET(self):  # the provisioner's `check --probe`
        checked = self.checked_body()
        if checked is not None:
            self.answer(200, {"msg": "ready"}, checked[1])

    def do_POST(self):
        checked = self.checked_body()
        if checked is None:
            return
        body, request_id = checked
        try:
            node = json.loads(body)
        except (ValueError, RecursionError):
            self.answer(400, {"msg": "the body is not JSON"}, request_id)
            return
        self.answer(200, reply_for(node, BROKERS), request_id)

    def log_message(self, fmt, *args):
        # One line per request, on stderr, without anything the server sent.
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


def read_secret(path):
    with open(path, "rb") as f:
        secret = f.read(4097)
    secret = secret[:-1] if secret.endswith(b"\n") else secret
    secret = secret[:-1] if secret.endswith(b"\r") else secret
    if not secret or len(secret) > 4096:
        sys.exit("%s must hold the shared secret (1 to 4096 bytes)" % path)
    return secret


BROKERS = os.environ.get("CHORIA_BROKERS") or sys.exit("CHORIA_BROKERS is not set")
SECRET = read_secret(os.environ.get("HELPER_SECRET_FILE") or sys.exit("HELPER_SECRET_FILE is not set"))
SEEN = SeenIds(MAX_REMEMBERED)
HOST, _, PORT = os.environ.get("HELPER_LISTEN", "127.0.0.1:8080").rpartition(":")
http.server.ThreadingHTTPServer((HOST, int(PORT)), Handler).serve_forever()
