"""taskservs/postgres/start.py — starts a real PostgreSQL server in a test
environment node (Debian's postgresql), listening on the node's address
and loopback, trusting connections from the environment's subnet, and
waits until `pg_isready` says it accepts connections. Its cluster is made
once with initdb in the node's data dir (never the host's
/var/lib/postgresql); settings are small and unsafe for data that matters
(fsync off): it is a test environment. PostgreSQL refuses to run as root,
so the server runs as the `postgres` user. The input and the result are
lib/taskserv_start.py's; the result adds the data dir and the user.
"""

import glob
import os
import pwd
import shutil
import subprocess
import sys

# No __pycache__ beside the shared scripts: a node writes only its own files.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
import taskserv_start as ts  # noqa: E402

USER = "postgres"


def bin_dirs():
    """Debian's versioned bin dirs, newest first."""
    dirs = glob.glob("/usr/lib/postgresql/*/bin")
    return sorted(dirs, key=lambda d: int(d.split("/")[-2]) if d.split("/")[-2].isdigit() else 0,
                  reverse=True)


def as_user(argv, reach_with_dac_override):
    """`argv` run as the postgres user. When that user cannot reach the
    node's data dir (a directory of the service's, mode 0700, above it: no
    root of its own yet), the process keeps CAP_DAC_OVERRIDE, which the
    node's root holds anyway, and nothing else."""
    wrapper = ["setpriv", "--reuid", USER, "--regid", USER, "--init-groups"]
    if reach_with_dac_override:
        wrapper += ["--inh-caps=+dac_override", "--ambient-caps=+dac_override"]
    return wrapper + ["--"] + argv


def can_reach(path):
    out = subprocess.run(
        ["setpriv", "--reuid", USER, "--regid", USER, "--init-groups", "--", "test", "-w", path],
        capture_output=True,
    )
    return out.returncode == 0


def main():
    data = ts.read_input("postgres")
    dirs = bin_dirs()
    postgres = ts.binary("postgres", dirs)
    initdb = ts.binary("initdb", dirs)
    pg_isready = ts.binary("pg_isready")
    version = ts.version_of([postgres, "--version"], r"\(PostgreSQL\)\s*(\S+)")
    try:
        user = pwd.getpwnam(USER)
    except KeyError:
        raise ts.StartError(f"there is no `{USER}` user in this node (is postgresql installed?)")
    if not ts.has_capability(ts.CAP_SETUID):
        raise ts.StartError(
            "postgres refuses to run as root and this node's root lacks CAP_SETUID to run it "
            f"as `{USER}`"
        )
    data_dir, log_file, pid_file = ts.prepare(data)
    ts.stop_earlier(pid_file, "postgres")
    # The lock file of the server just stopped: its pid may linger as a
    # zombie (a node's first process need not reap), which postgres would
    # take for a server still running.
    try:
        os.unlink(os.path.join(data_dir, "postmaster.pid"))
    except FileNotFoundError:
        pass
    top = data["data_dir"]
    os.chown(top, user.pw_uid, user.pw_gid)
    for path in (log_file,):
        open(path, "a").close()
        os.chown(path, user.pw_uid, user.pw_gid)
    reach = not can_reach(top)
    if reach:
        ts.say(f"the {USER} user cannot reach {top} by itself: it keeps CAP_DAC_OVERRIDE")
    if not os.path.exists(os.path.join(data_dir, "PG_VERSION")):
        # Made aside, then renamed: a killed initdb leaves no half cluster.
        fresh = data_dir + ".initdb"
        shutil.rmtree(fresh, ignore_errors=True)
        out = subprocess.run(
            as_user([initdb, "-D", fresh, "-U", USER, "--auth=trust", "--no-sync",
                     "--encoding=UTF8", "--locale=C", "--no-instructions"], reach),
            capture_output=True, text=True, cwd=top,
        )
        if out.returncode != 0:
            raise ts.StartError(f"initdb failed ({out.returncode}): {out.stderr.strip()[-500:]}")
        with open(os.path.join(fresh, "pg_hba.conf"), "w") as f:
            f.write(
                "# test environment: the node itself and the environment's subnet\n"
                "local all all trust\n"
                "host all all 127.0.0.1/32 trust\n"
                f"host all all {data['subnet']} trust\n"
            )
        os.rename(fresh, data_dir)
    argv = [
        postgres, "-D", data_dir,
        "-c", f"listen_addresses={data['address']},127.0.0.1",
        "-c", f"port={data['port']}",
        # No socket in the host's /run/postgresql: TCP only.
        "-c", "unix_socket_directories=",
        "-c", "dynamic_shared_memory_type=mmap",
        "-c", "shared_buffers=16MB",
        "-c", "max_connections=20",
        "-c", "fsync=off",
        "-c", "synchronous_commit=off",
        "-c", "full_page_writes=off",
        "-c", "huge_pages=off",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    process = ts.detach(as_user(argv, reach), log_file, pid_file, cwd=top, env=env)
    ts.wait_until(
        f"postgres on {data['node']}",
        process,
        log_file,
        lambda: ts.probe(
            [pg_isready, "-h", "127.0.0.1", "-p", str(data["port"]), "-U", USER, "-t", "2"],
            expect="accepting connections",
        ),
    )
    ts.say(f"ok: postgres {version} accepts connections at {data['address']}:{data['port']}")
    ts.emit({
        "taskserv": "postgres",
        "version": version,
        "node": data["node"],
        "pid": process.pid,
        "user": USER,
        "listen": [data["address"], "127.0.0.1"],
        "trusts": data["subnet"],
    })


if __name__ == "__main__":
    ts.run(main)
