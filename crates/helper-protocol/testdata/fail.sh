#!/bin/sh
# Fails after writing a long stderr; only its tail must be reported.
i=0
while [ $i -lt 200 ]; do echo "noise line $i" >&2; i=$((i+1)); done
echo "the real reason: no site for this node" >&2
exit 3
