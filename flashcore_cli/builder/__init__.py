"""Stage 2, build: the CUDA toolchain, content-addressed JIT builds, ptxas resources, tuned parameters, `new`."""
