# Print something that is not JSON.
cat >/dev/null
printf 'this is {not json at all\n'
