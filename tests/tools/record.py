"""A declared tool for the tests: records its argv (one JSON line in $OUT) and echoes it.

$SLEEP: seconds to take after recording (a call still running); $STAMPS: a file to which the start time is added.
"""

import json
import os
import sys
import time

if os.environ.get("STAMPS"):
    with open(os.environ["STAMPS"], "a") as stamps:
        stamps.write(f"{time.time()}\n")
with open(os.environ["OUT"], "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\n")
time.sleep(float(os.environ.get("SLEEP") or 0))
print("ran " + json.dumps(sys.argv[1:]))
