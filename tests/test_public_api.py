"""What the README's Python API section documents is importable from the package itself."""


def test_the_documented_errors_import_from_flashcore_cli():
    from flashcore_cli import (
        FlashcoreEnvironmentError,
        FlashcoreError,
        FlashcoreInputError,
        FlashcoreUnsupportedError,
        load_variant,
    )

    assert issubclass(FlashcoreInputError, FlashcoreError) and issubclass(FlashcoreInputError, ValueError)
    assert issubclass(FlashcoreUnsupportedError, FlashcoreError) and issubclass(FlashcoreUnsupportedError, NotImplementedError)
    assert issubclass(FlashcoreEnvironmentError, FlashcoreError) and issubclass(FlashcoreEnvironmentError, RuntimeError)
    assert callable(load_variant)
