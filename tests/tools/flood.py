"""A declared tool that prints N megabytes."""

import sys

line = ("x" * 1023 + "\n").encode()
out = sys.stdout.buffer
out.write(b"BEGIN\n")
for _ in range(int(sys.argv[1]) * 1024):
    out.write(line)
out.write(b"END\n")
