#!/bin/sh
# Starts a child that would outlive the helper, records its pid, then hangs.
sleep 300 &
echo $! > "$1"
sleep 300
