#!/usr/bin/env python3
"""Sample provisioning helper: x509 enrollment with a local certificate authority.

The server generated a key and a CSR (features.pki); this helper signs the CSR with a local CA
using the openssl command and returns the certificate, the CA and the configuration.

Everything in the input comes from the server, that is from anyone holding a provisioning JWT.
Before anything is signed:
  - the identity must be a plain DNS-like name (the provisioner's grammar) and not a Choria
    client name (*.mcollective, *.choria);
  - the CSR's self-signature must verify and its subject must hold exactly one common name,
    equal to the identity;
  - the SSL directory must be an absolute path of plain characters.
The certificate's only subject alternative name is DNS:<identity>, written from the checked
identity; the names the CSR asks for are not copied (openssl x509 -req copies no extensions).

  CHORIA_BROKERS   comma separated broker URLs for the provisioned servers (required)
  CHORIA_CA_CERT   the CA certificate (PEM)
  CHORIA_CA_KEY    the CA private key (PEM)
  CHORIA_CERT_DAYS certificate validity in days (default 365)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

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


def common_names(csr_file):
    """The CSR's common names, or None when its self-signature does not verify.

    openssl prints one RDN a line, its attributes separated by ' + ', with control characters,
    non-ASCII bytes and RFC 2253 specials in values escaped, so a value cannot pose as another
    attribute or line.
    """
    out = subprocess.run(
        ["openssl", "req", "-in", csr_file, "-noout", "-verify", "-subject",
         "-nameopt", "sep_multiline,sname,esc_ctrl,esc_msb,esc_2253"],
        capture_output=True, text=True,
    )
    if out.returncode != 0:
        return None
    names = []
    for line in out.stdout.splitlines()[1:]:
        for ava in line.strip().split(" + "):
            key, _, value = ava.partition("=")
            if key == "CN":
                names.append(value)
    return names


node = json.load(sys.stdin)
if not isinstance(node, dict):
    defer("the input is not a JSON object")
problem = identity_problem(node.get("identity"))
if problem:
    defer("refused: " + problem)
identity = node["identity"]

csr_in = node.get("csr")
csr = csr_in.get("csr") if isinstance(csr_in, dict) else None
if not isinstance(csr, str) or not csr:
    defer("no CSR received: enable features.pki")
ssldir = csr_in.get("ssldir") or "/etc/choria/ssl"
if not safe_path(ssldir):
    defer("refused: the SSL directory is not an absolute path of letters, digits, '.', '_', "
          "'-' and '/'")

ca_cert = os.environ["CHORIA_CA_CERT"]
ca_key = os.environ["CHORIA_CA_KEY"]
days = str(int(os.environ.get("CHORIA_CERT_DAYS", "365")))

with tempfile.TemporaryDirectory() as tmp:
    csr_file = os.path.join(tmp, "req.pem")
    ext_file = os.path.join(tmp, "ext.cnf")
    with open(csr_file, "w") as f:
        f.write(csr)
    names = common_names(csr_file)
    if names is None:
        defer("refused: the CSR's self-signature does not verify")
    if names != [identity]:
        defer("refused: the CSR's common name is not the identity")
    # Written from the checked identity alone, which holds only letters, digits, '.', '_' and
    # '-': nothing in it means anything to openssl's configuration language.
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
