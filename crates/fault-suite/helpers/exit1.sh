# Exit non-zero with a reason on stderr and nothing on stdout.
cat >/dev/null
echo "helper: refusing to configure this node" >&2
exit 1
