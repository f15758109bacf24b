"""Command line: the only code that prints (and, with load.py, reads files)."""
