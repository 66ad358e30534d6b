"""A declared tool that fails: exit status 3, a line on each stream."""

import sys

print("partial output")
print(f"error: {sys.argv[1]}", file=sys.stderr)
sys.exit(3)
