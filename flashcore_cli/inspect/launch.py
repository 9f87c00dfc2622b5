"""A variant launched under an outside tool (compute-sanitizer, ncu): built first in a plain worker, so the
compile never runs under the tool, then called on one case in a worker whose command the tool wraps."""

from __future__ import annotations

from flashcore_cli.core import isolate
from flashcore_cli.core.errors import EXIT_CHECK_FAILED, FlashcoreError
from flashcore_cli.core.protocol import LAST_WORDS, WorkRequest, classify
from flashcore_cli.registry.variants import Registry, Variant
from flashcore_cli.registry.shapes import Case


def build_first(registry: Registry, variant: Variant, arch: str, purpose: str) -> None:
    """Build (or find in the cache) the variant exactly as the launch will load it; a failure is exit 1."""
    outcome = isolate.run_worker(WorkRequest("build", str(registry.path), variant.name, arch), run_timeout=60)
    if outcome.built:
        return
    detail = classify(outcome, answered=False, wording=LAST_WORDS).detail  # its answer is the build
    raise FlashcoreError(f"{variant.name}: the build failed, nothing to {purpose}:\n{detail}", exit_code=EXIT_CHECK_FAILED)


def launch_under(prefix: list[str], registry: Registry, variant: Variant, arch: str, case: Case, *, timeout: float,
                 env: dict[str, str] | None = None) -> isolate.WorkerOutcome:  # fmt: skip
    """One call of the variant on `case`, in a worker run as `prefix... python -m flashcore_cli.worker`."""
    request = WorkRequest("launch", str(registry.path), variant.name, arch, case=case.as_dict(), calls=1)
    return isolate.run_worker(request, run_timeout=timeout, prefix=prefix, env=env)
