"""A declared tool for the tests: records its argv (one JSON line in $OUT) and echoes it."""

import json
import os
import sys

with open(os.environ["OUT"], "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\n")
print("ran " + json.dumps(sys.argv[1:]))
