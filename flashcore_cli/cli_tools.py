"""The playground's instruments (sanitize, profile, sass, sweep, compare, tune, doctor, new), registered onto
the main app by register(). Like cli.py, this module only parses and delegates."""

from __future__ import annotations


def register(app, handle_errors) -> None:
    """Add the instrument commands to `app`; each is wrapped in handle_errors like the core commands."""
