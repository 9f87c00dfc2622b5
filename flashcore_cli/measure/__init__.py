"""Stage 5, measure: timing and its modes (modes.py: cold, graph, host), what a worker times (timed.py), bench, sweep
and tune beside the references, over every GPU."""
