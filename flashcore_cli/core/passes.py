"""What a timed call does (bench --pass): the forward, the backward (from a saved forward), or both. Their
FLOPs and bytes are registry/shapes.py's (pass_flops, pass_bytes)."""

PASSES = ("fwd", "bwd", "fwd+bwd")
DEFAULT_PASS = "fwd"  # a run that names none; records from before --pass timed the forward
