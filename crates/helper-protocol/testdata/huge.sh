#!/bin/sh
# Writes output forever; the runner must stop it at its size limit.
yes '{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa":1}'
