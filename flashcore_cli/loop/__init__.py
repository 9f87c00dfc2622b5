"""The edit loop: `flashcore watch` rebuilds, checks and times a variant on every save (watch.py)."""
