#!/usr/bin/env python3
"""Rollback of the example step "provision" (templates/infra-then-config.yaml).

A rollback script receives {step, each, input, output}: the step's ref_name,
its for_each values (null here), the input the step ran with, and the output
it returned. This one deletes what provision_infra.py created for that
environment: the network, the VMs, and any host configuration under
$ORCHESTRATOR_DATA_DIR/examples/<env>/.

Result: {env, step, destroyed: [names], changed, check_mode, would_change
(check mode only)}. Idempotent: nothing left to destroy is not an error.
"""
import json
import os
import re
import shutil
import sys

params = json.load(sys.stdin)
step_input = params.get("input") or {}
env = step_input.get("env")
if not isinstance(env, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", env):
    print(f"error: input.env: {env!r} is not a valid name", file=sys.stderr)
    sys.exit(2)
check = step_input.get("check_mode") is True or os.environ.get("ORCHESTRATOR_CHECK_MODE") == "true"

root = os.path.join(os.environ["ORCHESTRATOR_DATA_DIR"], "examples", env)
found = []
if os.path.exists(os.path.join(root, "network.json")):
    found.append(f"{env}-net")
if os.path.isdir(os.path.join(root, "vms")):
    found += sorted(n[:-5] for n in os.listdir(os.path.join(root, "vms")) if n.endswith(".json"))

if not os.path.isdir(root):
    print(f"{env}: nothing to destroy", file=sys.stderr)
elif check:
    print(f"check mode: would destroy {', '.join(found) or root}", file=sys.stderr)
else:
    print(f"destroying {', '.join(found) or root} (undoing step {params.get('step')})", file=sys.stderr)
    shutil.rmtree(root)

result = {"env": env, "step": params.get("step"), "destroyed": [] if check else found,
          "changed": bool(found) and not check, "check_mode": check}
if check:
    result["would_change"] = bool(found)
print(json.dumps(result))
