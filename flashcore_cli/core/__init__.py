"""Foundations every stage uses: the one user-facing error type and exit codes, the rich consoles, run records on disk."""
