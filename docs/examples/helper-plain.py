#!/usr/bin/env python3
"""Sample provisioning helper: plain (jwt) enrollment.

The provisioner runs this once per server with the server's details as JSON on stdin and reads
the server's new configuration as JSON from stdout. It never sees a server that failed a check.

Settings come from the environment so one script serves every site:
  CHORIA_BROKERS   comma separated broker URLs for the provisioned servers (required)
  CHORIA_SSLDIR    where provisioned servers keep their certificates (default /etc/choria/ssl)
"""
import json
import os
import sys

node = json.load(sys.stdin)
identity = node["identity"]
inventory = json.loads(node["inventory"] or "{}")

brokers = os.environ.get("CHORIA_BROKERS")
if not brokers:
    # A helper that cannot decide defers: the provisioner retries the node on a later cycle.
    print(json.dumps({"defer": True, "msg": "CHORIA_BROKERS is not set"}))
    sys.exit(0)

config = {
    "identity": identity,
    "plugin.choria.server.provision": "false",
    "plugin.choria.middleware_hosts": brokers,
    "plugin.choria.use_srv": "false",
    "loglevel": "info",
    "plugin.choria.status_file_path": "/var/log/choria-status.json",
}

# Facts the server reported while provisioning can steer the configuration.
facts = inventory.get("facts", {})
if facts.get("role"):
    config["classesfile"] = "/etc/choria/classes.txt"

print(json.dumps({"configuration": config, "msg": "configured by helper-plain.py"}))
