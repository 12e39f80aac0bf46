"""Workload 11 of `make bench`: the peer rows' shapes run through Luigi.

Builds `layers` x `width` tasks; task (l, i) of a layer after the first
depends on tasks i, i+1, ..., i+deps-1 (mod width) of the layer before, as
in workloads 2 and 7 (deps 0: every task independent). Each task runs the
benchmark's script as its own process (`bash <script>`) and then writes its
marker file (its LocalTarget) in `--out`, which must be empty so that every
run starts clean. Luigi runs them as `luigi --workers N --local-scheduler`
would, with its defaults otherwise.

Prints one JSON line on stdout: the tasks expected, the markers found
afterwards, Luigi's version and status, and the seconds inside
`luigi.build`. Exits 1 unless Luigi reports success and every marker is
there.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import luigi
from luigi.execution_summary import LuigiStatusCode


class Step(luigi.Task):
    """One no-op step: one spawn of `bash <script>`."""

    layer = luigi.IntParameter()
    index = luigi.IntParameter()
    width = luigi.IntParameter()
    # Not `deps`: that name is Task.deps(), the method Luigi calls.
    fan_in = luigi.IntParameter()
    script = luigi.Parameter()
    out = luigi.Parameter()

    def requires(self):
        if self.layer == 0:
            return []
        return [
            self.clone(layer=self.layer - 1, index=(self.index + k) % self.width)
            for k in range(self.fan_in)
        ]

    def output(self):
        return luigi.LocalTarget(os.path.join(self.out, f"l{self.layer}_{self.index}"))

    def run(self):
        # check=True: a failing script fails the task, and so the run.
        subprocess.run(["bash", self.script], stdout=subprocess.DEVNULL, check=True)
        with self.output().open("w"):
            pass


class All(luigi.WrapperTask):
    """What the run asks for: the last layer (every task, without deps),
    as make's `all` target."""

    layers = luigi.IntParameter()
    width = luigi.IntParameter()
    fan_in = luigi.IntParameter()
    script = luigi.Parameter()
    out = luigi.Parameter()

    def requires(self):
        wanted = [self.layers - 1] if self.fan_in > 0 else range(self.layers)
        return [
            Step(layer=l, index=i, width=self.width, fan_in=self.fan_in, script=self.script, out=self.out)
            for l in wanted
            for i in range(self.width)
        ]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--deps", type=int, required=True, help="dependencies per task on the layer before")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--script", required=True, help="the script every task runs with bash")
    p.add_argument("--out", required=True, help="an empty directory for the marker files")
    a = p.parse_args()
    if a.layers < 1 or a.width < 1 or not 0 <= a.deps <= a.width:
        p.error("need layers >= 1, width >= 1 and 0 <= deps <= width")
    if os.listdir(a.out):
        p.error(f"{a.out} is not empty")

    t0 = time.monotonic()
    result = luigi.build(
        [All(layers=a.layers, width=a.width, fan_in=a.deps, script=a.script, out=a.out)],
        workers=a.workers,
        local_scheduler=True,
        detailed_summary=True,
    )
    build_s = time.monotonic() - t0
    tasks = a.layers * a.width
    done = len(os.listdir(a.out))
    ok = result.status == LuigiStatusCode.SUCCESS and done == tasks
    summary = {"luigi": luigi.__version__, "tasks": tasks, "done": done, "status": result.status.name, "build_s": build_s}
    print(json.dumps(summary))
    if not ok:
        print(result.summary_text, file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
