"""Foundations every stage uses: the one user-facing error type and exit codes, the rich consoles, run records on
disk, process isolation and the worker protocol (protocol.py: the request, the events, one classifier of outcomes)."""
