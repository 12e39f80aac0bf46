"""taskservs/etcd/start.py — starts a real etcd member in a test environment
node (Debian's etcd-server), clustered with the environment's other etcd
nodes, and waits until `etcdctl endpoint health` passes on it (which needs
the cluster's quorum: the other members' starts run alongside). The input
and the result are lib/taskserv_start.py's; the result adds the member's
client and peer URLs and the cluster it joined.
"""

import os
import sys

# No __pycache__ beside the shared scripts: a node writes only its own files.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
import taskserv_start as ts  # noqa: E402

# The peer port: the client port's neighbour, as etcd's defaults have it.
PEER_OFFSET = 1


def main():
    data = ts.read_input("etcd")
    etcd = ts.binary("etcd")
    etcdctl = ts.binary("etcdctl")
    version = ts.version_of([etcd, "--version"], r"etcd Version:\s*(\S+)")
    data_dir, log_file, pid_file = ts.prepare(data)
    ts.stop_earlier(pid_file, "etcd")
    port, peer_port = data["port"], data["port"] + PEER_OFFSET
    address = data["address"]
    client_url = f"http://{address}:{port}"
    peer_url = f"http://{address}:{peer_port}"
    cluster = ",".join(f"{p['name']}=http://{p['address']}:{peer_port}" for p in data["peers"])
    argv = [
        etcd,
        "--name", data["node"],
        "--data-dir", data_dir,
        "--listen-client-urls", f"{client_url},http://127.0.0.1:{port}",
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", cluster,
        # One token per environment: members of two environments never
        # mistake each other (they cannot reach each other either).
        "--initial-cluster-token", f"testenv-{data.get('env', '')}",
        "--initial-cluster-state", "new",
        # etcd's own defaults, said aloud: quicker elections would save a
        # second at the start, but on a busy host (CI) members could lose
        # their leader in the middle of a check.
        "--heartbeat-interval", "100",
        "--election-timeout", "1000",
        "--quota-backend-bytes", str(64 * 1024 * 1024),
    ]
    # etcd would read ETCD_* settings from the environment; it gets none.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    process = ts.detach(argv, log_file, pid_file, cwd=data["data_dir"], env=env)
    local = f"http://127.0.0.1:{port}"
    ts.wait_until(
        f"etcd on {data['node']}",
        process,
        log_file,
        lambda: ts.probe(
            [etcdctl, "--endpoints", local, "--dial-timeout", "2s", "--command-timeout", "3s",
             "endpoint", "health"],
            env={**env, "ETCDCTL_API": "3"},
        ),
    )
    ts.say(f"ok: etcd {version} member {data['node']} is healthy at {client_url}")
    ts.emit({
        "taskserv": "etcd",
        "version": version,
        "node": data["node"],
        "pid": process.pid,
        "client_url": client_url,
        "peer_url": peer_url,
        "initial_cluster": cluster,
    })


if __name__ == "__main__":
    ts.run(main)
