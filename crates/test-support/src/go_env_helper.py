#!/usr/bin/env python3
# Sample provisioning helper for the test environment in @DIR@.
import json, os, subprocess, sys, tempfile

DIR = "@DIR@"
ISSUER = "@ISSUER@"
node = json.load(sys.stdin)
identity = node["identity"]


def sign(tmp):
    """Sign tmp/req.csr with the test CA for this identity; return the certificate PEM."""
    with open(os.path.join(tmp, "ext"), "w") as f:
        f.write("extendedKeyUsage = serverAuth,clientAuth\nsubjectAltName = DNS:%s\n" % identity)
    subprocess.run(["openssl", "x509", "-req", "-in", os.path.join(tmp, "req.csr"),
                    "-CA", DIR + "/pki/ca.pem", "-CAkey", DIR + "/pki/ca-key.pem",
                    # A random serial: helpers run in parallel and a shared serial file races.
                    "-set_serial", str(int.from_bytes(os.urandom(8), "big") >> 1), "-days", "30",
                    "-sha256", "-extfile", os.path.join(tmp, "ext"),
                    "-out", os.path.join(tmp, "cert.pem")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(tmp, "cert.pem")) as f:
        return f.read()

def use_ssldir(ssldir):
    """Hand the node the test CA and its files in ssldir, where its certificate goes."""
    with open(DIR + "/pki/ca.pem") as f:
        reply["ca"] = f.read()
    reply["ssldir"] = ssldir
    conf["plugin.security.file.certificate"] = ssldir + "/certificate.pem"
    conf["plugin.security.file.key"] = ssldir + "/private.pem"
    conf["plugin.security.file.ca"] = ssldir + "/ca.pem"


reply = {"defer": False, "msg": "configured by the test helper", "certificate": "", "ca": "",
          "ssldir": "", "key": "", "configuration": {}, "server_claims": {}}
conf = {
    "identity": identity,
    "plugin.choria.server.provision": "false",
    "plugin.choria.middleware_hosts": "@URL@",
    "plugin.choria.use_srv": "false",
    "plugin.security.provider": "file",
    "loglevel": "info",
}
csr = node.get("csr")
ed = node.get("ed25519_pubkey")
if ed:
    conf["plugin.security.provider"] = "choria"
    conf["plugin.security.choria.token_file"] = ed["directory"] + "/server.jwt"
    conf["plugin.security.choria.seed_file"] = ed["directory"] + "/server.seed"
    conf["plugin.security.issuer.names"] = "choria"
    conf["plugin.security.issuer.choria.public"] = ISSUER
elif csr:
    ssldir = csr["ssldir"]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "req.csr"), "w") as f:
            f.write(csr["csr"])
        reply["certificate"] = sign(tmp)
    use_ssldir(ssldir)
elif os.environ.get("HELPER_SUPPLY_KEY"):
    # The helper makes the key: the provisioner encrypts it for the server (ECDH + PEM).
    ssldir = DIR + "/servers/" + identity + "/ssl"
    keys = DIR + "/provisioner/keys"
    os.makedirs(keys, exist_ok=True)
    key = os.path.join(keys, identity + ".pem")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["openssl", "genrsa", "-traditional", "-out", key, "2048"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["openssl", "req", "-new", "-key", key, "-subj", "/CN=" + identity,
                        "-out", os.path.join(tmp, "req.csr")],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reply["certificate"] = sign(tmp)
    with open(key) as f:
        reply["key"] = f.read()
    use_ssldir(ssldir)
else:
    boot = DIR + "/servers/" + identity + "/boot"
    conf["plugin.security.file.certificate"] = boot + "/cert.pem"
    conf["plugin.security.file.key"] = boot + "/key.pem"
    conf["plugin.security.file.ca"] = DIR + "/pki/ca.pem"
reply["configuration"] = conf
json.dump(reply, sys.stdout)
