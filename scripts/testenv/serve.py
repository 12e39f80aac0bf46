"""testenv/serve.py — the long-running process of a simulated taskserv in a
test environment node.

Started by the orchestrator inside the node (its own network, UTS, mount and
PID namespaces) as `python3 testenv/serve.py --service NAME --port N --ready FILE`.
It listens on 0.0.0.0:N and answers every GET with one JSON object,
{"service": NAME, "node": <host name>}, so a check on another node can tell
that it reached the right service on the right node. Once it listens it
writes FILE (atomically), which is how the orchestrator knows it started.
It runs until it is killed, which happens when its node is torn down.
"""

import argparse
import json
import os
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--service", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ready", required=True)
    args = parser.parse_args()
    answer = json.dumps({"service": args.service, "node": socket.gethostname()}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, fmt, *values):
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % values))

    server = ThreadingHTTPServer(("0.0.0.0", args.port), Handler)
    tmp = args.ready + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, args.ready)
    print(f"{args.service} listening on port {args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
