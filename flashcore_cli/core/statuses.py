"""How a variant, a case or a row ended: the one list of outcomes (DESIGN.md, "Isolation"), each spelled once.
Records and tables carry the strings; code names them through these constants."""

OK = "OK"
MISMATCH = "MISMATCH"  # ran, and its output is wrong beyond the tolerance
TIMEOUT = "TIMEOUT"  # killed after its wall-clock limit
CRASH = "CRASH"  # the worker raised, faulted or died
BUILD_FAIL = "BUILD-FAIL"
SKIP = "SKIP"  # not asked of this variant: a head dim, dtype, feature or arch it does not declare
NOT_RUN = "NOT-RUN"  # a case left after its variant stopped (a crash, a timeout, a failed build)

STATUSES = (OK, MISMATCH, TIMEOUT, CRASH, BUILD_FAIL, SKIP, NOT_RUN)
FAILURES = (MISMATCH, TIMEOUT, CRASH, BUILD_FAIL)  # a check that failed: exit 1
