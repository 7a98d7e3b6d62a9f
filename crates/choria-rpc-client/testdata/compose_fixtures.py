#!/usr/bin/env python3
"""Composes the golden protocol fixtures in this directory.

Field order and encodings follow go-choria's protocol structs (protocol/v1, protocol/v2,
protocol/filter.go, lifecycle/*.go): Go []byte fields are padded standard base64, v1 inner
messages are JSON strings, v2 inner messages are base64. Run from this directory; it only needs
Python 3 with the `cryptography` package (for the deterministic RSA and ed25519 signatures).
"""
import base64, hashlib, json
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, ed25519

def dumps(o):
    return json.dumps(o, separators=(",", ":"), ensure_ascii=False).encode()

def b64(b):
    return base64.b64encode(b).decode()

def write(name, data):
    with open(name, "wb") as f:
        f.write(data)

REQ_ID = "2c5f1e6a7b8c4d9e8f7a6b5c4d3e2f10"
SENDER = "provisioner.example.net"
CALLER = "choria=provisioner.mcollective"
COLLECTIVE = "provisioning"
AGENT = "rpcutil"
REPLY_TO = "provisioning.reply.%s.%s" % (hashlib.md5(CALLER.encode()).hexdigest(), REQ_ID)
PAYLOAD = b'{"agent":"rpcutil","action":"inventory","data":{}}'
FILTER = {"fact": [], "cf_class": [], "agent": ["choria_provision"], "identity": [], "compound": []}
NODE = "node1.example.net"
REPLY_BODY = b'{"action":"inventory","statuscode":0,"statusmsg":"OK","data":{}}'

# v1 request
v1_req = dumps({"protocol": "choria:request:1", "message": PAYLOAD.decode(), "envelope": {
    "requestid": REQ_ID, "senderid": SENDER, "callerid": CALLER, "collective": COLLECTIVE,
    "agent": AGENT, "ttl": 60, "time": 1718000000, "filter": FILTER}})
write("v1_request.json", v1_req)

def v1_transport_request(secure):
    return dumps({"protocol": "choria:transport:1", "data": b64(secure),
                  "headers": {"reply-to": REPLY_TO, "mc_sender": SENDER}})

sec = dumps({"protocol": "choria:secure:request:1", "message": v1_req.decode(),
             "signature": "insecure", "pubcert": "insecure"})
write("v1_secure_request_insecure.json", sec)
write("v1_transport_request_insecure.json", v1_transport_request(sec))

key = serialization.load_pem_private_key(open("x509_key.pem", "rb").read(), None)
cert = open("x509_cert.pem").read()
sig = key.sign(v1_req, padding.PKCS1v15(), hashes.SHA256())
sec = dumps({"protocol": "choria:secure:request:1", "message": v1_req.decode(),
             "signature": b64(sig), "pubcert": cert})
write("v1_secure_request_x509.json", sec)
write("v1_transport_request_x509.json", v1_transport_request(sec))

# v1 reply
v1_rep = dumps({"protocol": "choria:reply:1", "message": REPLY_BODY.decode(), "envelope": {
    "requestid": REQ_ID, "senderid": NODE, "agent": AGENT, "time": 1718000001}})
write("v1_reply.json", v1_rep)
sec = dumps({"protocol": "choria:secure:reply:1", "message": v1_rep.decode(),
             "hash": b64(hashlib.sha256(v1_rep).digest())})
write("v1_secure_reply.json", sec)
write("v1_transport_reply.json", dumps({"protocol": "choria:transport:1", "data": b64(sec),
                                        "headers": {"mc_sender": NODE}}))

# v2 request, signed with a fixed seed
seed = bytes(range(32))
sk = ed25519.Ed25519PrivateKey.from_private_bytes(seed)
pk = sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
claims = base64.urlsafe_b64encode(dumps({"callerid": "provisioner_signer", "public_key": pk.hex()})).rstrip(b"=").decode()
jwt = "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9.%s.c2lnbmF0dXJl" % claims
write("v2_seed.hex", seed.hex().encode())
write("v2_caller.jwt", jwt.encode())
v2_reply_to = "provisioning.reply.%s.%s" % (hashlib.md5(b"provisioner_signer").hexdigest(), REQ_ID)
v2_req = dumps({"protocol": "io.choria.protocol.v2.request", "message": b64(PAYLOAD), "id": REQ_ID,
                "sender": SENDER, "caller": "provisioner_signer", "collective": COLLECTIVE,
                "agent": AGENT, "ttl": 60, "time": 1718000000123456789, "filter": FILTER})
write("v2_request.json", v2_req)
sec = dumps({"protocol": "io.choria.protocol.v2.secure_request", "request": b64(v2_req),
             "signature": b64(sk.sign(v2_req)), "caller": jwt})
write("v2_secure_request.json", sec)
write("v2_transport_request.json", dumps({"protocol": "io.choria.protocol.v2.transport", "data": b64(sec),
                                          "headers": {"reply": v2_reply_to, "sender": SENDER}}))

# v2 reply
v2_rep = dumps({"protocol": "io.choria.protocol.v2.reply", "message": b64(REPLY_BODY), "request": REQ_ID,
                "sender": NODE, "agent": AGENT, "time": 1718000001000000000})
write("v2_reply.json", v2_rep)
sec = dumps({"protocol": "io.choria.protocol.v2.secure_reply", "reply": b64(v2_rep),
             "hash": b64(hashlib.sha256(v2_rep).digest())})
write("v2_secure_reply.json", sec)
write("v2_transport_reply.json", dumps({"protocol": "io.choria.protocol.v2.transport", "data": b64(sec),
                                        "headers": {"sender": NODE}}))

# lifecycle startup event, both formats
ev = {"protocol": "io.choria.lifecycle.v1.startup", "id": "4f2b6a2e-8c1d-4d7e-9f30-1b2c3d4e5f60",
      "identity": NODE, "component": "provision_mode_server", "timestamp": 1718000000, "version": "0.30.0"}
write("lifecycle_startup_choria.json", dumps(ev))
write("lifecycle_startup_cloudevent.json", dumps({"specversion": "1.0", "id": ev["id"], "source": "io.choria.lifecycle",
    "type": ev["protocol"], "subject": NODE, "datacontenttype": "application/json",
    "time": "2024-06-10T06:13:20Z", "data": ev}))
