"""The bench's blocking start: a spin kernel that holds the GPU until the host has queued the timed call.

    gate = shared()
    gate.hold(); start.record(); fn(); end.record(); gate.release()
    end.synchronize(); gate.timed_out()  # True: discard the sample

The kernel (blocking_start.cu, package data) is harness code, not a variant: it is built once per torch,
CUDA, Python ABI and GPU arch with torch.utils.cpp_extension into <cache>/harness/blocking_start-<key>/, and
later processes import the built library directly (a build.json marker, as build.py does for variants).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from flashcore_cli.core.errors import EXIT_CHECK_FAILED, FlashcoreError

SOURCE = Path(__file__).with_name("blocking_start.cu")

# How long the GPU waits for the host before giving up on a sample. The host's work between hold() and
# release() is one dispatch: ~61 us for Triton's launcher, the slowest row measured; 100 ms is over 1000x that,
# so only a stalled host or a call that waits for the GPU itself (a synchronize inside it) reaches it. And it
# is short enough that such a call costs a bench row well under a second (MAX_TIMEOUTS of them), not a hang.
SPIN_TIMEOUT_MS = 100.0


class BlockingStart:
    def __init__(self, timeout_ms: float = SPIN_TIMEOUT_MS):
        self.timeout_ms = timeout_ms
        self._ext = load_extension()

    def hold(self) -> None:
        """Queue the spin on the current stream: what is queued after it waits for release()."""
        self._ext.hold(int(self.timeout_ms * 1e6))

    def release(self) -> None:
        self._ext.release()

    def timed_out(self) -> bool:
        """Whether the last hold() gave up before release(); valid once the stream has synchronized."""
        return bool(self._ext.timed_out())


_shared: BlockingStart | FlashcoreError | None = None


def shared() -> BlockingStart:
    """The process's gate, built or loaded on first use; a failed build is reported once, then re-raised."""
    global _shared
    if _shared is None:
        try:
            _shared = BlockingStart()
        except FlashcoreError as exc:
            _shared = exc
    if isinstance(_shared, FlashcoreError):
        raise _shared
    return _shared


def extension_key(arch: str) -> str:
    import sysconfig

    import torch

    from flashcore_cli.builder.toolchain import nvcc_version

    parts = [SOURCE.read_text(), torch.__version__, torch.version.cuda, sysconfig.get_config_var("EXT_SUFFIX"), arch, nvcc_version()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def load_extension():
    """The built extension module for the current GPU: imported from the cache, or built there first."""
    import torch

    from flashcore_cli.core.records import cache_root
    from flashcore_cli.builder.toolchain import gencode

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    key = extension_key(arch)
    name = f"flashcore_blocking_start_{key}"
    if name in sys.modules:
        return sys.modules[name]
    directory = cache_root() / "harness" / f"blocking_start-{key}"
    marker = directory / "build.json"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.lock", "a") as lock:  # one builder; the others wait, then load
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            from torch.utils import cpp_extension

            try:
                module = cpp_extension.load(
                    name=name,
                    sources=[str(SOURCE)],
                    extra_cflags=["-O3", "-std=c++17"],
                    extra_cuda_cflags=["-O3", "-std=c++17", gencode(arch)],
                    build_directory=str(directory),
                    verbose=False,
                )
            except Exception as exc:
                raise FlashcoreError(
                    f"the bench's blocking-start kernel ({SOURCE}) failed to build in {directory}: {exc}", exit_code=EXIT_CHECK_FAILED
                ) from None
            marker.write_text(json.dumps({"module": name, "library": Path(module.__file__).name, "arch": arch}))
            sys.modules[name] = module
            return module
    library = directory / json.loads(marker.read_text())["library"]
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
