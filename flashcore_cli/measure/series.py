"""A sweep record read as series, one per name (variant or reference), for sweep's table and plot's chart.

Both sweep.py and plot.py import it; it imports neither.
"""

from __future__ import annotations


def series(record: dict) -> dict[str, dict[int, dict]]:
    """name -> seq_len -> row, names in the order they first appear (the references first)."""
    out: dict[str, dict[int, dict]] = {}
    for row in record["rows"]:
        out.setdefault(row["name"], {})[row["seq_len"]] = row
    return out
