"""A declared tool for the tests: prints the file it is given (as `cat` would, a secret in it and all)."""

import sys

with open(sys.argv[1]) as shown:
    sys.stdout.write(shown.read())
