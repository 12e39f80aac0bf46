"""taskservs/redis/start.py — starts a real Redis server in a test
environment node (Debian's redis-server) on the node's address and
loopback, without persistence, and waits until `redis-cli PING` answers
PONG. The input and the result are lib/taskserv_start.py's.
"""

import os
import sys

# No __pycache__ beside the shared scripts: a node writes only its own files.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
import taskserv_start as ts  # noqa: E402


def main():
    data = ts.read_input("redis")
    server = ts.binary("redis-server")
    cli = ts.binary("redis-cli")
    version = ts.version_of([server, "--version"], r"v=(\S+)")
    data_dir, log_file, pid_file = ts.prepare(data)
    ts.stop_earlier(pid_file, "redis-server")
    os.makedirs(data_dir, exist_ok=True)
    port = str(data["port"])
    argv = [
        server,
        "--bind", data["address"], "127.0.0.1",
        "--port", port,
        # Reachable from the other nodes without a password: the bridge
        # reaches nothing but the environment.
        "--protected-mode", "no",
        "--save", "",
        "--appendonly", "no",
        "--dir", data_dir,
        "--daemonize", "no",
        "--logfile", "",
    ]
    process = ts.detach(argv, log_file, pid_file, cwd=data_dir)
    ts.wait_until(
        f"redis on {data['node']}",
        process,
        log_file,
        lambda: ts.probe([cli, "-h", "127.0.0.1", "-p", port, "PING"], expect="PONG"),
    )
    ts.say(f"ok: redis {version} answers PONG at {data['address']}:{port}")
    ts.emit({
        "taskserv": "redis",
        "version": version,
        "node": data["node"],
        "pid": process.pid,
        "listen": [data["address"], "127.0.0.1"],
    })


if __name__ == "__main__":
    ts.run(main)
