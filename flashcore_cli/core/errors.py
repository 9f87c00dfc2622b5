"""The one exception type for user-facing errors (rendered without a traceback), and the exit codes.

Exit codes of every command (README, "Exit codes"):
    0    success
    1    a check failed: a MISMATCH/CRASH/TIMEOUT/BUILD-FAIL, a spill under --fail-on-spill, a regression
    2    bad input or an unusable environment: a FlashcoreError (a typo, a broken registry or record, ...)
    3    an internal error: a bug in flashcore; one line, and the traceback in a log file
    130  interrupted (Ctrl-C)
    141  the output went to a pipe that closed early (`flashcore list | head -1`): killed by SIGPIPE, quietly,
         as cat and git are (entry.main)
"""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process killed by SIGPIPE (128 + 13)


class FlashcoreError(Exception):
    """Something the user can fix (bad input, a missing tool, a broken registry). Exit code 2 by default."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.exit_code = exit_code


class FlashcoreInputError(FlashcoreError, ValueError):
    """Bad tensors handed to a variant: wrong device, dtype, shape, layout, or a head dim it does not support."""


class FlashcoreUnsupportedError(FlashcoreError, NotImplementedError):
    """A variant asked for what it does not do: a gradient through a forward-only variant, an lse it does not
    compute."""


class FlashcoreEnvironmentError(FlashcoreError, RuntimeError):
    """This machine cannot do what was asked (a CPU build of torch, a GPU the variant does not run on)."""

