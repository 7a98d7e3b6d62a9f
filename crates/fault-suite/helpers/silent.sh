# Succeed without printing anything.
cat >/dev/null
exit 0
