"""Hooks of the contract run (run.sh loads this module).

A request that asks to `wait` stays open until its workflow ends: for a
generated submission that asks for up to 100 attempts of a script failing
on made-up inputs, minutes, past any client timeout. Such requests are sent
without it (`wait: false`, `?wait=false`), which the document allows as it
allows `true`; waiting has its own tests (crates/orchestrator/tests/it/
provisioning.rs and tasks.rs).
"""

import schemathesis


@schemathesis.hook
def before_call(context, case, kwargs):
    if isinstance(case.body, dict) and case.body.get("wait") is True:
        case.body["wait"] = False
    if isinstance(case.query, dict) and case.query.get("wait") in (True, "true"):
        case.query["wait"] = "false"
