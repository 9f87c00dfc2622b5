"""The one exception type for user-facing errors: rendered without a traceback."""


class FlashcoreError(Exception):
    """Something the user can fix (bad input, a missing tool, a broken registry). Exit code 2 by default."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


class FlashcoreInputError(FlashcoreError, ValueError):
    """Bad tensors handed to a variant: wrong device, dtype, shape, layout, or a head dim it does not support."""
