#!/usr/bin/env python3
"""Sample provisioning helper: Organization Issuer enrollment (features.ed25519).

The server made an ed25519 key (its directory is in the input); the provisioner signs a server
JWT for it after this helper answers. The configuration points the server at that JWT and seed.

  CHORIA_BROKERS   comma separated broker URLs for the provisioned servers (required)
  CHORIA_ISSUER    the Organization Issuer public key, 64 hex characters (required)
"""
import json
import os
import sys

node = json.load(sys.stdin)
identity = node["identity"]
ed = node.get("ed25519_pubkey") or {}
directory = ed.get("directory")

if not directory:
    print(json.dumps({"defer": True, "msg": "no ed25519 key received: enable features.ed25519"}))
    sys.exit(0)

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
