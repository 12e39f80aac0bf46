# taskservs/containerd/check.nu — containerd is simulated (testenv/serve.py): it answers on its port
# (from the node the check runs in, on every target node). See lib/testenv.nu
# for the input and docs/test-environments.md for writing a check.
const LIB = path self ../../lib/testenv.nu
use $LIB *

def main [] { check-service containerd }
