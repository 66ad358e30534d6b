"""A declared tool that starts a child and hangs: its pids go to $PIDS, one line each."""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["PIDS"], "a") as pids:
    pids.write(f"{sys.argv[1]} {os.getpid()} {child.pid}\n")
print("started", flush=True)
time.sleep(600)
