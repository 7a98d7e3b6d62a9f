#!/usr/bin/env python3
"""Sample provisioning helper: Organization Issuer enrollment (features.ed25519).

The server made an ed25519 key (its directory is in the input); the provisioner signs a server
JWT for it after this helper answers. The configuration points the server at that JWT and seed.

Everything in the input comes from the server, that is from anyone holding a provisioning JWT:
the identity becomes the identity of the server JWT, so it is checked against the provisioner's
grammar before anything else, and the key directory is checked before it is used in a path.

  CHORIA_BROKERS   comma separated broker URLs for the provisioned servers (required)
  CHORIA_ISSUER    the Organization Issuer public key, 64 hex characters (required)
"""
import json
import os
import re
import sys

# The provisioner's identity grammar: labels of ASCII letters, digits, '-' and '_', 1 to 63
# bytes each, separated by single dots, at most 253 bytes in all. Use fullmatch: with match and
# a closing $, Python also accepts a trailing newline.
IDENTITY = re.compile(r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*")
# A directory on the server: absolute, plain characters, no '..'.
SAFE_PATH = re.compile(r"/[A-Za-z0-9._/-]{0,1023}")


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


def safe_path(path):
    return (isinstance(path, str) and SAFE_PATH.fullmatch(path) is not None
            and ".." not in path.split("/"))


def defer(why):
    print(json.dumps({"defer": True, "msg": why}))
    sys.exit(0)


node = json.load(sys.stdin)
if not isinstance(node, dict):
    defer("the input is not a JSON object")
problem = identity_problem(node.get("identity"))
if problem:
    defer("refused: " + problem)
identity = node["identity"]

ed = node.get("ed25519_pubkey")
if not isinstance(ed, dict) or not ed.get("directory"):
    defer("no ed25519 key received: enable features.ed25519")
directory = ed["directory"]
if not safe_path(directory):
    defer("refused: the key directory is not an absolute path of letters, digits, '.', '_', "
          "'-' and '/'")

config = {
    "identity": identity,
    "plugin.choria.server.provision": "false",
    "plugin.choria.middleware_hosts": os.environ["CHORIA_BROKERS"],
    "plugin.choria.use_srv": "false",
    "plugin.security.provider": "choria",
    "plugin.security.choria.token_file": os.path.join(directory, "server.jwt"),
    "plugin.security.choria.seed_file": os.path.join(directory, "server.seed"),
    "plugin.security.issuer.names": "choria",
    "plugin.security.issuer.choria.public": os.environ["CHORIA_ISSUER"],
    "collectives": "choria",
    "loglevel": "info",
}

claims = {"collectives": ["choria"], "permissions": {"streams": False, "submission": True}}

print(json.dumps({"configuration": config, "server_claims": claims}))
