"""Stage 3, inspect: what a kernel compiled to and how it runs under the tools (sass, profile, sanitize, doctor)."""
