"""Stage 6, report: comparing run records and regenerating the README tables and ladder chart from them."""
