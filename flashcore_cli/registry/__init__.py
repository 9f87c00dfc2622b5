"""Stage 1, the registry: variants.yaml validated, shapes and cases, target archs, tuning constraints."""
