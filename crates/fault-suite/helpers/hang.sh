# Hang past the provisioner's 10 s helper timeout, leaving a child behind whose pid is recorded
# so the suite can check it was killed with the helper.
cat >/dev/null
sleep 300 &
: > "@DIR@/children/$!"
sleep 300
