#!/bin/sh
# A plain helper in shell: the identity is taken from the compact JSON on stdin and a minimal
# configuration is printed. Cheap to start, for the tests with larger fleets.
input=$(cat)
id=$(printf '%s' "$input" | sed -n 's/.*"identity":"\([^"]*\)".*/\1/p')
if [ -z "$id" ]; then
    echo "no identity in the input" >&2
    exit 1
fi
printf '{"configuration":{"identity":"%s","plugin.choria.server.provision":"false","plugin.choria.middleware_hosts":"%s"}}\n' "$id" "${CHORIA_BROKERS:-nats://127.0.0.1:4222}"
