// flashcore_defaults.h — what a rung that leaves out an optional part of the contract (flashcore.h) gets:
// fp16 only, no features, no backward. Weak definitions, so a rung's own definition wins at link time.
// Included by the two programs that link a rung — the torch binding (binding.cpp) and the ptxas probe —
// never by a rung itself.
#pragma once

#include "flashcore.h"

__attribute__((weak)) int flashcore_dtypes() { return 1 << kFlashcoreFloat16; }

__attribute__((weak)) int flashcore_features() { return 0; }

__attribute__((weak)) size_t flashcore_forward_workspace(const FlashcoreParams&) { return 0; }

__attribute__((weak)) int flashcore_max_seq_len() { return 0; }

__attribute__((weak)) const char* flashcore_forward_note() { return nullptr; }

__attribute__((weak)) size_t flashcore_backward_workspace(const FlashcoreParams&) { return 0; }

__attribute__((weak)) const char* flashcore_backward(const FlashcoreBackwardParams&, cudaStream_t) {
  return "this variant is forward-only: it defines no backward (flashcore_features() lacks kFlashcoreBackward)";
}
