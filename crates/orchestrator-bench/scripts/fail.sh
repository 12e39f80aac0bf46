# Fails at once; the scale workload uses it to seed a share of failed tasks.
echo 'bench: failing on purpose' >&2
exit 1
