"""Foundations every stage uses: the one user-facing error type and the exit codes (errors.py), the facts declared
once (statuses.py, dtypes.py, passes.py, events.py: the worker's event kinds), the one way to ask about the GPU
(gpu.py), the rich consoles the command layer draws on, run records on disk, process isolation and the worker
protocol (protocol.py: the request, the outcome, one classifier of outcomes)."""
