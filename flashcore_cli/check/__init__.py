"""Stage 4, check: correctness against the fp32 reference, each variant isolated in a worker process."""
