// common/family.cuh — the device arithmetic of the attention family (flashcore.h: window, softcap, sinks) that every
// rung shares; which keys a row sees is flashcore.h's (fc::visible_keys, fc::key_visible, fc::visible_rows).
#pragma once

#include "flashcore.h"

namespace fc {

// tanh on the MUFU unit (PTX tanh.approx.f32, sm_75+: one instruction, relative error about 2^-11): the softcap's
// tanh. A capped score c * tanh(s / c) is then off by at most about c * 2^-11 — the size of a 16-bit score's own
// rounding at |s| near c.
__device__ __forceinline__ float tanh_fast(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A row's end with a sink, in log2 units: m2 is the row max of the (capped) scores times log2 e (-inf when the row
// saw no key), l = sum_j exp2(s2_j - m2), sink2 the head's sink logit times log2 e (-inf: none). Returns the row's
// LSE in log2 units (+inf when it saw no key and has no sink) and sets o_scale, the factor that turns the
// accumulator sum_j exp2(s2_j - m2) v_j into O (0 for a row that saw no key).
__device__ __forceinline__ float finish_row_log2(float m2, float l, float sink2, float& o_scale) {
  if (!(l > 0.f)) {
    o_scale = 0.f;
    return sink2 == -INFINITY ? INFINITY : sink2;
  }
  const float top = fmaxf(m2, sink2);
  const float total = l * exp2f(m2 - top) + exp2f(sink2 - top);
  const float lse2 = top + __log2f(total);
  o_scale = exp2f(m2 - lse2);
  return lse2;
}

}  // namespace fc
