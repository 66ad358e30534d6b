"""A declared tool that sleeps for the given seconds, then says so."""

import sys
import time

time.sleep(float(sys.argv[1]))
print(f"rested {sys.argv[1]} s")
