"""Command line: the only code that prints (and, with specs/load.py, reads files)."""
