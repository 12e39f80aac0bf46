#!/usr/bin/env python3
"""Example step "configure": the Ansible half of templates/infra-then-config.yaml.

Simulates configuring every host that the "provision" step created. The
template hands it provision's outputs: `ips` and `names` as lists (whole
references keep their JSON type) and `network` as a string.

Input (JSON on stdin):
  env         environment name
  names       VM names, in the same order as `ips`
  ips         VM addresses
  network     the network's CIDR, for the record
  packages    list of package names to "install"
  motd        text for the message of the day
  break_host  optional VM name whose configuration fails on purpose (to try
              the rollback policy); null by default
  check_mode  dry run (ORCHESTRATOR_CHECK_MODE=true also turns it on)

Writes $ORCHESTRATOR_DATA_DIR/examples/<env>/config/<vm>.json per host.
Result: {env, hosts: [{name, ip, packages, changed}], configured, changed,
check_mode, warnings, would_change (check mode only)}.
"""
import json
import os
import re
import sys

# Names become file names: hold them to a safe alphabet.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def fail(message, code=1):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


params = json.load(sys.stdin)
env = params.get("env")
names = params.get("names")
ips = params.get("ips")
packages = params.get("packages") or []
if not isinstance(env, str) or not NAME.match(env):
    fail(f"env: {env!r} is not a valid name", 2)
if not isinstance(names, list) or not isinstance(ips, list) or len(names) != len(ips) or not names:
    fail(f"names and ips must be non-empty lists of the same length, got {names!r} and {ips!r}", 2)
bad = [n for n in names if not isinstance(n, str) or not NAME.match(n)]
if bad:
    fail(f"names: {bad!r} are not valid names", 2)
if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
    fail(f"packages: expected a list of strings, got {packages!r}", 2)
check = params.get("check_mode") is True or os.environ.get("ORCHESTRATOR_CHECK_MODE") == "true"

root = os.path.join(os.environ["ORCHESTRATOR_DATA_DIR"], "examples", env)
hosts, warnings, errors = [], [], []
would_change = False
for name, ip in zip(names, ips):
    if not os.path.exists(os.path.join(root, "vms", f"{name}.json")):
        if check:
            # In a dry run the provision step created nothing: not an error.
            warnings.append(f"{name} does not exist yet")
        else:
            errors.append(f"{name} ({ip}) does not exist; run the provision step first")
            continue
    if name == params.get("break_host"):
        errors.append(f"{name} ({ip}): configuration failed (break_host)")
        continue
    desired = {"name": name, "ip": ip, "network": params.get("network"),
               "packages": packages, "motd": params.get("motd")}
    config_file = os.path.join(root, "config", f"{name}.json")
    current = None
    if os.path.exists(config_file):
        with open(config_file) as f:
            current = json.load(f)
        current = {k: current.get(k) for k in desired}
    changed = current != desired
    if check:
        print(f"check mode: would {'configure' if changed else 'leave'} {name} at {ip}", file=sys.stderr)
    elif changed:
        print(f"configuring {name} at {ip}: {', '.join(packages) or 'no packages'}", file=sys.stderr)
        os.makedirs(os.path.dirname(config_file), exist_ok=True)
        with open(f"{config_file}.tmp", "w") as f:
            json.dump({**desired, "configured_by": os.environ.get("ORCHESTRATOR_TASK_ID")}, f, indent=2)
        os.replace(f"{config_file}.tmp", config_file)
    else:
        print(f"{name} at {ip} is already configured", file=sys.stderr)
    hosts.append({"name": name, "ip": ip, "packages": packages, "changed": changed and not check})
    would_change = would_change or changed

if errors:
    fail("; ".join(errors))
result = {
    "env": env,
    "hosts": hosts,
    "configured": len(hosts),
    "changed": any(h["changed"] for h in hosts),
    "check_mode": check,
    "warnings": warnings,
}
if check:
    result["would_change"] = would_change
print(json.dumps(result))
