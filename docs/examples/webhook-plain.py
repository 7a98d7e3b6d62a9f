#!/usr/bin/env python3
"""Sample provisioning helper as a webhook: plain (jwt) enrollment over HTTP.

Set the provisioner's `helper` to this server's URL and `helper_secret_file` to the file named by
HELPER_SECRET_FILE here. The provisioner POSTs each server's details as JSON (the very bytes a
command helper reads on stdin) and reads the server's configuration as JSON from the answer.
Every request is signed: X-Choria-Provisioner-Signature is "sha256=" and the hex HMAC-SHA256,
keyed with the shared secret, of the X-Choria-Provisioner-Timestamp value, ".", the
X-Choria-Provisioner-Request-Id value, "." and the body. A request that is unsigned, signed with
another secret or more than five minutes old is answered 401 and nothing is done for it.

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
import hmac
import http.server
import json
import os
import re
import sys
import time

# The provisioner's identity grammar: labels of ASCII letters, digits, '-' and '_', 1 to 63
# bytes each, separated by single dots, at most 253 bytes in all. Use fullmatch: with match and
# a closing $, Python also accepts a trailing newline.
IDENTITY = re.compile(r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*")
MAX_BODY = 1024 * 1024
MAX_SKEW = 300


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


def signature_problem(secret, headers, body):
    """Why the request is not the provisioner's, or None when its signature holds."""
    timestamp = headers.get("X-Choria-Provisioner-Timestamp", "")
    request_id = headers.get("X-Choria-Provisioner-Request-Id", "")
    signature = headers.get("X-Choria-Provisioner-Signature", "")
    if not re.fullmatch(r"[0-9]{1,12}", timestamp) or abs(time.time() - int(timestamp)) > MAX_SKEW:
        return "missing or stale timestamp"
    signed = timestamp.encode() + b"." + request_id.encode() + b"." + body
    expected = "sha256=" + hmac.new(secret, signed, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return "bad signature"
    return None


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

    def answer(self, status, document):
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_body(self):
        length = self.headers.get("Content-Length", "0")
        if not re.fullmatch(r"[0-9]{1,8}", length) or int(length) > MAX_BODY:
            self.close_connection = True
            return None
        return self.rfile.read(int(length))

    def checked_body(self):
        """The body when the request is signed with our secret; else answers and None."""
        body = self.read_body()
        if body is None:
            self.answer(413, {"msg": "the body is too large"})
            return None
        problem = signature_problem(SECRET, self.headers, body)
        if problem:
            self.answer(401, {"msg": problem})
            return None
        return body

    def do_GET(self):  # the provisioner's `check --probe`
        if self.checked_body() is not None:
            self.answer(200, {"msg": "ready"})

    def do_POST(self):
        body = self.checked_body()
        if body is None:
            return
        try:
            node = json.loads(body)
        except (ValueError, RecursionError):
            self.answer(400, {"msg": "the body is not JSON"})
            return
        self.answer(200, reply_for(node, BROKERS))

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
HOST, _, PORT = os.environ.get("HELPER_LISTEN", "127.0.0.1:8080").rpartition(":")
http.server.ThreadingHTTPServer((HOST, int(PORT)), Handler).serve_forever()
