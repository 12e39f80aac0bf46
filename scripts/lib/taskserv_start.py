"""lib/taskserv_start.py — what the taskservs' start.py scripts share in test
environments. A module, not a task script.

A start script runs inside a node (its namespaces, and its own root where
the provider gives one), with one JSON object on stdin:

    {"env": <environment id>, "taskserv": <name>, "node": <this node>,
     "address": <this node's address>, "subnet": "<a.b.c>.0/24",
     "port": <the taskserv's port>, "data_dir": <relative path>,
     "peers": [{"name", "address"}, ...]}

`peers` are the environment's nodes that run the same taskserv, this one
included, in the environment's order. `data_dir` is relative to
$ORCHESTRATOR_DATA_DIR, the node's private directory. The script starts its
daemon detached (a session of its own, its output to a log file in the
node), waits until the daemon answers by its own protocol, and prints one
JSON object as its last stdout line: {"taskserv", "version", ...}. It exits
1 naming what failed, with the tail of the daemon's log. A start run again
(a retried step, or a run of an environment not started by its create)
stops the daemon an earlier start left, by the pid file in the node, and
starts a new one: it never adopts one.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

# How long a daemon may take to answer; the step's own timeout is longer.
START_WAIT = 60.0
# How often the wait asks again.
POLL = 0.05
# How much of the daemon's log a failure shows.
LOG_TAIL_LINES = 20
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,30}[a-z0-9])?$")
ADDRESS_RE = re.compile(r"^\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}$")
# CAP_SETUID's bit in the capability sets.
CAP_SETUID = 7


class StartError(Exception):
    """Why a start failed, said in one line (lowercase, names the value)."""


def fail(message: str, code: int = 1):
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def say(message: str):
    print(message, file=sys.stderr, flush=True)


def read_input(expected: str) -> dict:
    """The input on stdin, checked: names, addresses, port, peers."""
    try:
        data = json.load(sys.stdin)
    except ValueError as e:
        fail(f"the input is not a JSON object: {e}", 2)
    if not isinstance(data, dict):
        fail("the input is not a JSON object", 2)
    if data.get("taskserv") != expected:
        fail(f"this start script is for {expected}, not {data.get('taskserv')!r}", 2)
    for field in ("node",):
        if not isinstance(data.get(field), str) or not NAME_RE.match(data[field]):
            fail(f"field `{field}` must be a node name, got {data.get(field)!r}", 2)
    if not isinstance(data.get("address"), str) or not ADDRESS_RE.match(data["address"]):
        fail(f"field `address` must be an IPv4 address, got {data.get('address')!r}", 2)
    port = data.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        fail(f"field `port` must be a port number, got {port!r}", 2)
    peers = data.get("peers")
    if not isinstance(peers, list) or not peers:
        fail("field `peers` must list the nodes that run the taskserv", 2)
    for peer in peers:
        if (
            not isinstance(peer, dict)
            or not NAME_RE.match(str(peer.get("name", "")))
            or not ADDRESS_RE.match(str(peer.get("address", "")))
        ):
            fail(f"field `peers` holds {peer!r}, not a {{name, address}}", 2)
    relative = data.get("data_dir")
    if (
        not isinstance(relative, str)
        or not relative
        or relative.startswith("/")
        or ".." in relative.split("/")
    ):
        fail(f"field `data_dir` must be a relative path inside the node, got {relative!r}", 2)
    base = os.environ.get("ORCHESTRATOR_DATA_DIR") or os.getcwd()
    data["data_dir"] = os.path.join(base, relative)
    return data


def emit(result: dict):
    print(json.dumps(result, separators=(",", ":")), flush=True)


def has_capability(bit: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << bit))
    except OSError:
        pass
    return False


def binary(name: str, extra_dirs=()) -> str:
    """The path of a program: in `extra_dirs` first, then on PATH."""
    for directory in extra_dirs:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        raise StartError(f"`{name}` is not installed in this node (not on PATH)")
    return found


def version_of(argv: list, pattern: str) -> str:
    """The version a binary prints for `argv` (`etcd --version`), the first
    group of `pattern` in it."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise StartError(f"cannot run `{' '.join(argv)}`: {e}")
    text = out.stdout + out.stderr
    match = re.search(pattern, text)
    if out.returncode != 0 or match is None:
        raise StartError(
            f"`{' '.join(argv)}` printed no version ({out.returncode}): {text.strip()[:200]}"
        )
    return match.group(1)


def is_gone(pid: int) -> bool:
    """Whether `pid` has ended (a zombie that no one reaps counts as ended:
    the node's first process may not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except (OSError, IndexError):
        return True


def stop_earlier(pid_file: str, program: str):
    """Stops the daemon an earlier start left (its whole session), if the
    pid file names one still running `program`; removes the pid file."""
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmdline = ""
    if program in cmdline and not is_gone(pid):
        say(f"stopping {program} (pid {pid}) left by an earlier start")
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 15
        while not is_gone(pid):
            if time.monotonic() > deadline:
                raise StartError(f"{program} (pid {pid}) left by an earlier start does not stop")
            time.sleep(POLL)
    os.unlink(pid_file)


def log_tail(log_file: str) -> str:
    try:
        with open(log_file, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"


def detach(argv: list, log_file: str, pid_file: str, cwd: str, env=None) -> subprocess.Popen:
    """Starts `argv` in a session of its own, stdin from /dev/null, its
    output appended to `log_file`, and writes its pid to `pid_file`."""
    with open(log_file, "ab") as log:
        log.write(f"--- start: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise StartError(f"cannot start `{argv[0]}`: {e}")
    tmp = pid_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(process.pid))
    os.rename(tmp, pid_file)
    return process


def wait_until(what: str, process: subprocess.Popen, log_file: str, answers, wait=START_WAIT):
    """Polls `answers()` until it is true; fails naming `what` and the log's
    tail if the daemon exits first or `wait` seconds pass."""
    deadline = time.monotonic() + wait
    last = ""
    while True:
        ok, last = answers()
        if ok:
            return
        status = process.poll()
        if status is not None:
            raise StartError(
                f"{what} exited ({status}) before it answered; its log ends:\n{log_tail(log_file)}"
            )
        if time.monotonic() > deadline:
            raise StartError(
                f"{what} did not answer within {wait:.0f} s ({last}); its log ends:\n"
                f"{log_tail(log_file)}"
            )
        time.sleep(POLL)


def probe(argv: list, env=None, expect=None):
    """Runs a client (`etcdctl endpoint health`, `pg_isready`, `redis-cli
    ping`): (whether it succeeded and printed `expect`, what it printed)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    text = (out.stdout + out.stderr).strip()
    ok = out.returncode == 0 and (expect is None or expect in out.stdout)
    return ok, text.splitlines()[-1] if text else f"exit {out.returncode}"


def prepare(data: dict):
    """The taskserv's directory in the node, made; (its data dir, log file,
    pid file)."""
    root = data["data_dir"]
    os.makedirs(root, exist_ok=True)
    return (
        os.path.join(root, "data"),
        os.path.join(root, "daemon.log"),
        os.path.join(root, "daemon.pid"),
    )


def run(main):
    """Runs `main()`, turning a StartError into exit 1 with its reason."""
    try:
        main()
    except StartError as e:
        fail(str(e))


def start_simulated(name: str):
    """The start of a simulated taskserv (one that cannot run here for
    real): testenv/serve.py, detached, answering HTTP on the taskserv's
    port with {"service", "node"}; started once its ready file appears."""
    data = read_input(name)
    serve = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testenv", "serve.py")
    _, log_file, pid_file = prepare(data)
    stop_earlier(pid_file, "serve.py")
    ready = os.path.join(data["data_dir"], "ready")
    if os.path.exists(ready):
        os.unlink(ready)
    argv = [sys.executable, os.path.abspath(serve), "--service", name,
            "--port", str(data["port"]), "--ready", ready]
    process = detach(argv, log_file, pid_file, cwd=data["data_dir"])
    wait_until(f"{name} (simulated) on {data['node']}", process, log_file,
               lambda: (os.path.exists(ready), "no ready file yet"))
    say(f"ok: {name} (simulated by testenv/serve.py) answers on port {data['port']}")
    emit({"taskserv": name, "version": "simulated", "simulated": True,
          "node": data["node"], "pid": process.pid})
