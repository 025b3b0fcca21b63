"""Imported by probe.py as `from helper import ...` (needs the script's folder on sys.path) and by
the module form as `from proj.helper import ...` (needs the working folder on sys.path)."""
GREETING = "hello"
