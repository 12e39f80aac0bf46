"""taskservs/containerd/start.py — containerd cannot run in a test environment node
here, so it is simulated: testenv/serve.py answers on its port (see
lib/taskserv_start.py for the input and the result).
"""

import os
import sys

# No __pycache__ beside the shared scripts: a node writes only its own files.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
import taskserv_start as ts  # noqa: E402

if __name__ == "__main__":
    ts.run(lambda: ts.start_simulated("containerd"))
