#!/usr/bin/env python3
"""A provisioning helper for the end-to-end tests, misbehaving on request.

usage: scenario.py BEHAVIOUR [ARGUMENT]

  configure          answer with a plain configuration
  upgrade VERSION    a configuration and a request to upgrade to VERSION
  defer              defer the node
  shutdown           ask for the node to be shut down
  fail               write a message on stderr and exit 3
  garbage            print something that is not JSON
  hang               sleep far longer than the provisioner's helper timeout
  slow SECONDS       sleep, then answer with a configuration
  by-name [VERSION]  the behaviour the identity starts with: defer-..., shutdown-...,
                     upgrade-... (to VERSION), fail-...; any other identity is configured

Environment:
  HELPER_ONLY      only identities containing this text misbehave; the others are configured
  HELPER_ONCE_DIR  each identity misbehaves on its first call only (a marker file per identity
                   is left here) and is configured on later calls
  HELPER_LOG       append "<identity> <behaviour>" for every call, to count calls
  HELPER_PIDS      append the process id of every call
  CHORIA_BROKERS   brokers written into the configuration
"""
import json
import os
import sys
import time

node = json.load(sys.stdin)
identity = node["identity"]
behaviour = sys.argv[1] if len(sys.argv) > 1 else "configure"
argument = sys.argv[2] if len(sys.argv) > 2 else ""

if behaviour == "by-name":
    behaviour = identity.split("-", 1)[0]
    if behaviour not in ("defer", "shutdown", "upgrade", "fail"):
        behaviour = "configure"

only = os.environ.get("HELPER_ONLY")
if only and only not in identity:
    behaviour = "configure"

once_dir = os.environ.get("HELPER_ONCE_DIR")
if once_dir and behaviour != "configure":
    marker = os.path.join(once_dir, identity)
    if os.path.exists(marker):
        behaviour = "configure"
    else:
        open(marker, "w").close()

for var, text in (("HELPER_LOG", "%s %s" % (identity, behaviour)), ("HELPER_PIDS", str(os.getpid()))):
    path = os.environ.get(var)
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")

config = {
    "identity": identity,
    "plugin.choria.server.provision": "false",
    "plugin.choria.middleware_hosts": os.environ.get("CHORIA_BROKERS", "nats://127.0.0.1:4222"),
    "plugin.choria.use_srv": "false",
}

if behaviour == "configure":
    print(json.dumps({"configuration": config}))
elif behaviour == "upgrade":
    print(json.dumps({"configuration": config, "upgrade": argument}))
elif behaviour == "defer":
    print(json.dumps({"defer": True, "msg": "the CMDB does not know %s yet" % identity}))
elif behaviour == "shutdown":
    print(json.dumps({"shutdown": True, "msg": "%s is not wanted here" % identity}))
elif behaviour == "fail":
    sys.stderr.write("cannot reach the CMDB\n")
    sys.exit(3)
elif behaviour == "garbage":
    print("this is not json {")
elif behaviour == "hang":
    sys.stdout.flush()
    time.sleep(120)
elif behaviour == "slow":
    time.sleep(float(argument or "1"))
    print(json.dumps({"configuration": config}))
else:
    sys.stderr.write("unknown behaviour %s\n" % behaviour)
    sys.exit(2)
