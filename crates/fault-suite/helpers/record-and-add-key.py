#!/usr/bin/env python3
# Records the helper input, runs the working helper, and adds a private key with its certificate
# to the reply so the provisioner has a helper-supplied key to encrypt for the node.
import json, os, subprocess, sys

data = sys.stdin.buffer.read()
with open(os.path.join("@INPUTS@", "%d.json" % os.getpid()), "wb") as f:
    f.write(data)
out = subprocess.run(["@DEMO@"], input=data, capture_output=True)
if out.returncode != 0:
    sys.stderr.buffer.write(out.stderr)
    sys.exit(out.returncode)
reply = json.loads(out.stdout)
with open("@KEY@") as f:
    reply["key"] = f.read()
with open("@CERT@") as f:
    reply["certificate"] = f.read()
with open("@CA@") as f:
    reply["ca"] = f.read()
reply["ssldir"] = "/etc/choria/ssl"
print(json.dumps(reply))
