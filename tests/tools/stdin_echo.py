"""A declared tool that echoes the JSON document it reads on stdin."""

import json
import sys

document = json.load(sys.stdin)
print("stdin " + json.dumps(document, sort_keys=True))
