#!/usr/bin/env python3
"""Example step "provision": the Terraform half of templates/infra-then-config.yaml.

Simulates creating one network and N virtual machines for an environment.
Nothing leaves the machine: the "infrastructure" is JSON files under
$ORCHESTRATOR_DATA_DIR/examples/<env>/.

Input (JSON on stdin):
  env         environment name, e.g. "staging" (letters, digits, `.`, `_`, `-`)
  vm_count    number of VMs, 1-50
  check_mode  dry run (ORCHESTRATOR_CHECK_MODE=true also turns it on)

Addresses are derived from the environment name, so they are the same on
every machine and every run: the network is 10.X.Y.0/24 with X = 64 + (byte 0
of sha256(env) mod 64) and Y = byte 1; VM i (from 1) is at .(10 + i).

Result (last stdout line): {env, network: {name, cidr, gateway}, vms: [{name,
ip}], names, ips, changed, check_mode, warnings, would_change (check mode only)}.
Idempotent: what already exists is not rewritten.
"""
import hashlib
import json
import os
import re
import sys

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def fail(message, code=2):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def write_json(path, value):
    """Atomic write: a temporary file in the same directory, then a rename."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2)
    os.replace(tmp, path)


params = json.load(sys.stdin)
env = params.get("env")
count = params.get("vm_count")
if not isinstance(env, str) or not NAME.match(env):
    fail(f"env: {env!r} is not a valid name")
if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 50:
    fail(f"vm_count: {count!r} must be an integer from 1 to 50")
check = params.get("check_mode") is True or os.environ.get("ORCHESTRATOR_CHECK_MODE") == "true"

digest = hashlib.sha256(env.encode()).digest()
prefix = f"10.{64 + digest[0] % 64}.{digest[1]}"
network = {"name": f"{env}-net", "cidr": f"{prefix}.0/24", "gateway": f"{prefix}.1"}
vms = [{"name": f"{env}-vm-{i:02d}", "ip": f"{prefix}.{10 + i}"} for i in range(1, count + 1)]

root = os.path.join(os.environ["ORCHESTRATOR_DATA_DIR"], "examples", env)
owner = {"created_by": os.environ.get("ORCHESTRATOR_TASK_ID"),
         "workflow_id": os.environ.get("ORCHESTRATOR_WORKFLOW_ID")}
missing = []
network_file = os.path.join(root, "network.json")
if not os.path.exists(network_file):
    missing.append((network_file, {**network, **owner}, f"network {network['name']} {network['cidr']}"))
for vm in vms:
    vm_file = os.path.join(root, "vms", f"{vm['name']}.json")
    if not os.path.exists(vm_file):
        missing.append((vm_file, {**vm, "network": network["name"], **owner}, f"vm {vm['name']} at {vm['ip']}"))

warnings = []
extra = sorted(
    name[:-5] for name in os.listdir(os.path.join(root, "vms"))
    if name.endswith(".json") and name[:-5] not in {vm["name"] for vm in vms}
) if os.path.isdir(os.path.join(root, "vms")) else []
if extra:
    warnings.append(f"VMs beyond vm_count are left alone: {', '.join(extra)}")

for path, record, what in missing:
    if check:
        print(f"check mode: would create {what}", file=sys.stderr)
    else:
        print(f"creating {what}", file=sys.stderr)
        write_json(path, record)
if not missing:
    print(f"{env}: network and {count} VM(s) already exist", file=sys.stderr)

result = {
    "env": env,
    "network": network,
    "vms": vms,
    "names": [vm["name"] for vm in vms],
    "ips": [vm["ip"] for vm in vms],
    "changed": bool(missing) and not check,
    "check_mode": check,
    "warnings": warnings,
}
if check:
    result["would_change"] = bool(missing)
print(json.dumps(result))
