#!/usr/bin/env python3
"""Sample provisioning helper: plain (jwt) enrollment.

The provisioner runs this once per server with the server's details as JSON on stdin and reads
the server's new configuration as JSON from stdout. It never sees a server that failed a check.

Everything in the input comes from the server, that is from anyone holding a provisioning JWT:
the identity is checked against the provisioner's grammar before anything else, and the one
inventory fact used (the role) is only ever compared with a fixed value.

Settings come from the environment so one script serves every site:
  CHORIA_BROKERS   comma separated broker URLs for the provisioned servers (required)
"""
import json
import os
import re
import sys

# The provisioner's identity grammar: labels of ASCII letters, digits, '-' and '_', 1 to 63
# bytes each, separated by single dots, at most 253 bytes in all. Use fullmatch: with match and
# a closing $, Python also accepts a trailing newline.
IDENTITY = re.compile(r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*")


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


def defer(why):
    # A helper that cannot decide defers: the provisioner retries the node on a later cycle.
    print(json.dumps({"defer": True, "msg": why}))
    sys.exit(0)


def facts_of(inventory_text):
    """The server's facts, or {} when the inventory is not the shape expected."""
    try:
        inventory = json.loads(inventory_text) if isinstance(inventory_text, str) else None
    except (ValueError, RecursionError):
        return {}
    facts = inventory.get("facts") if isinstance(inventory, dict) else None
    return facts if isinstance(facts, dict) else {}


node = json.load(sys.stdin)
if not isinstance(node, dict):
    defer("the input is not a JSON object")
problem = identity_problem(node.get("identity"))
if problem:
    defer("refused: " + problem)
identity = node["identity"]

brokers = os.environ.get("CHORIA_BROKERS")
if not brokers:
    defer("CHORIA_BROKERS is not set")

config = {
    "identity": identity,
    "plugin.choria.server.provision": "false",
    "plugin.choria.middleware_hosts": brokers,
    "plugin.choria.use_srv": "false",
    "loglevel": "info",
    "plugin.choria.status_file_path": "/var/log/choria-status.json",
}

# Facts the server reported while provisioning can steer the configuration: compared with a
# fixed value, never copied into it.
if facts_of(node.get("inventory")).get("role") == "web":
    config["classesfile"] = "/etc/choria/classes.txt"

print(json.dumps({"configuration": config, "msg": "configured by helper-plain.py"}))
