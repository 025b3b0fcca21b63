"""Healthy but logs no metric: it prints now and then (and mostly waits), or stays silent when asked."""
import sys
import time

quiet = "--quiet" in sys.argv
for i in range(8):
    time.sleep(1.0)
    if not quiet:
        print(f"still working {i}", flush=True)
