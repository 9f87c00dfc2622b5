"""Stage 5, measure: timing (cold, graph, host), bench, sweep and tune beside the references, over every GPU."""
