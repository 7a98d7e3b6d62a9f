#!/bin/sh
# Reads the input and answers with a configuration naming the identity it was given.
input=$(cat)
id=$(printf '%s' "$input" | sed -n 's/.*"identity":"\([^"]*\)".*/\1/p')
printf '{"configuration":{"identity":"%s"},"msg":"ok"}' "$id"
