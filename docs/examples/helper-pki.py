#!/usr/bin/env python3
"""Sample provisioning helper: x509 enrollment with a local certificate authority.

The server generated a key and a CSR (features.pki); this helper signs the CSR with a local CA
using the openssl command and returns the certificate, the CA and the configuration.

  CHORIA_BROKERS   comma separated broker URLs for the provisioned servers (required)
  CHORIA_CA_CERT   the CA certificate (PEM)
  CHORIA_CA_KEY    the CA private key (PEM)
  CHORIA_CERT_DAYS certificate validity in days (default 365)
"""
import json
import os
import subprocess
import sys
import tempfile

node = json.load(sys.stdin)
identity = node["identity"]
csr = (node.get("csr") or {}).get("csr")
ssldir = (node.get("csr") or {}).get("ssldir") or "/etc/choria/ssl"

if not csr:
    print(json.dumps({"defer": True, "msg": "no CSR received: enable features.pki"}))
    sys.exit(0)

ca_cert = os.environ["CHORIA_CA_CERT"]
ca_key = os.environ["CHORIA_CA_KEY"]
days = os.environ.get("CHORIA_CERT_DAYS", "365")

with tempfile.TemporaryDirectory() as tmp:
    csr_file = os.path.join(tmp, "req.pem")
    ext_file = os.path.join(tmp, "ext.cnf")
    with open(csr_file, "w") as f:
        f.write(csr)
    with open(ext_file, "w") as f:
        f.write("subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n" % identity)
    cert = subprocess.run(
        ["openssl", "x509", "-req", "-in", csr_file, "-CA", ca_cert, "-CAkey", ca_key,
         "-CAcreateserial", "-CAserial", os.path.join(tmp, "ca.srl"),
         "-days", days, "-sha256", "-extfile", ext_file],
        check=True, capture_output=True, text=True,
    ).stdout

with open(ca_cert) as f:
    ca = f.read()

config = {
    "identity": identity,
    "plugin.choria.server.provision": "false",
    "plugin.choria.middleware_hosts": os.environ["CHORIA_BROKERS"],
    "plugin.choria.use_srv": "false",
    "plugin.security.provider": "file",
    "plugin.security.file.certificate": os.path.join(ssldir, "certificate.pem"),
    "plugin.security.file.key": os.path.join(ssldir, "private.pem"),
    "plugin.security.file.ca": os.path.join(ssldir, "ca.pem"),
    "loglevel": "info",
}

print(json.dumps({"configuration": config, "certificate": cert, "ca": ca, "ssldir": ssldir}))
