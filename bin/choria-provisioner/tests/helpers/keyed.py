#!/usr/bin/env python3
"""A helper that makes the node's private key itself (no CSR from the node): it creates an RSA
key and a certificate for the identity with openssl and returns both, so the provisioner has to
encrypt the key for the node with the key exchange of the `jwt` step.

  CHORIA_CA_CERT, CHORIA_CA_KEY   the CA signing the certificates
  CHORIA_BROKERS                  brokers written into the configuration
"""
import json
import os
import subprocess
import sys
import tempfile

node = json.load(sys.stdin)
identity = node["identity"]
ca_cert = os.environ["CHORIA_CA_CERT"]
ca_key = os.environ["CHORIA_CA_KEY"]
ssldir = "/etc/choria/ssl"

with tempfile.TemporaryDirectory() as tmp:
    key_file = os.path.join(tmp, "key.pem")
    csr_file = os.path.join(tmp, "req.pem")
    run = lambda *args: subprocess.run(args, check=True, capture_output=True, text=True).stdout
    run("openssl", "genrsa", "-traditional", "-out", key_file, "2048")
    run("openssl", "req", "-new", "-key", key_file, "-subj", "/CN=" + identity, "-out", csr_file)
    cert = run("openssl", "x509", "-req", "-in", csr_file, "-CA", ca_cert, "-CAkey", ca_key,
               "-CAcreateserial", "-CAserial", os.path.join(tmp, "ca.srl"), "-days", "2")
    with open(key_file) as f:
        key = f.read()

with open(ca_cert) as f:
    ca = f.read()

config = {
    "identity": identity,
    "plugin.choria.server.provision": "false",
    "plugin.choria.middleware_hosts": os.environ.get("CHORIA_BROKERS", "nats://127.0.0.1:4222"),
    "plugin.security.provider": "file",
    "plugin.security.file.certificate": os.path.join(ssldir, "certificate.pem"),
    "plugin.security.file.key": os.path.join(ssldir, "private.pem"),
    "plugin.security.file.ca": os.path.join(ssldir, "ca.pem"),
}

print(json.dumps({"configuration": config, "certificate": cert, "ca": ca, "ssldir": ssldir, "key": key}))
