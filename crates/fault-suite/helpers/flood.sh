# Print 100 MiB, far past the provisioner's 1 MiB output limit.
cat >/dev/null
head -c 104857600 /dev/zero | tr '\0' 'x'
