// blocking_start.cu — the bench's blocking start (harness code, not a variant; built by blocking_start.py).
//
// The GPU must not start a timed call's clock before the host has queued the call: a row whose host
// dispatch is slow (Triton's launcher: ~61 us per call) would otherwise be charged for an idle GPU. So before
// the start event the host launches wait_for_host, one thread that spins on a word in pinned host memory
// mapped into the device's address space; the host queues the start event, the timed call and the end event,
// and only then writes the word. The start event therefore fires once the whole call is already queued
// (nvbench's blocking kernel does the same).
//
// Each hold() gets a generation number, and the host releases it by writing that number: the flag never
// needs clearing, so a late spin of an earlier sample can never be confused with this one's.
// The spin gives up after `timeout_ns` of %globaltimer (nanoseconds), so a host that never releases it (a
// call that waits for the GPU, a crash between hold and release) cannot hang the device; it then writes its
// generation to `timed_out`, and the harness discards that sample.
// Only pybind11 and c10's CUDA headers (not torch/extension.h): the one-time build stays a few seconds.
#include <pybind11/pybind11.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace {

// Shared by host and device: pinned host memory, mapped (the device reads it over the bus, uncached).
struct Gate {
  uint64_t released;   // host -> device: the newest generation the host has released
  uint64_t timed_out;  // device -> host: the newest generation whose spin gave up
};

Gate* host_gate = nullptr;    // the host's view
Gate* device_gate = nullptr;  // the device's view of the same bytes
uint64_t generation = 0;      // the newest generation handed out by hold()

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ld.volatile on global memory is a relaxed load at system scope: every iteration reads the host's word anew.
__device__ __forceinline__ uint64_t load_volatile(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__global__ void wait_for_host(Gate* gate, uint64_t generation, uint64_t timeout_ns) {
  const uint64_t start = global_ns();
  while (load_volatile(&gate->released) < generation) {
    if (global_ns() - start > timeout_ns) {
      *reinterpret_cast<volatile uint64_t*>(&gate->timed_out) = generation;
      return;
    }
  }
}

void ensure_gate() {
  if (host_gate != nullptr) return;
  // Allocated once per process and never freed: 16 bytes, portable to every device of the process.
  void* p = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(&p, sizeof(Gate), cudaHostAllocMapped | cudaHostAllocPortable));
  host_gate = static_cast<Gate*>(p);
  host_gate->released = 0;
  host_gate->timed_out = 0;
  void* d = nullptr;
  C10_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
  device_gate = static_cast<Gate*>(d);
}

// Launch the spin on the current stream; everything queued after it waits for release().
void hold(int64_t timeout_ns) {
  TORCH_CHECK(timeout_ns > 0, "the spin's timeout must be positive");
  ensure_gate();
  ++generation;
  wait_for_host<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(device_gate, generation, uint64_t(timeout_ns));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Open the gate of the newest hold(). A sequentially consistent store: it leaves the CPU's store buffer at once.
void release() {
  TORCH_CHECK(host_gate != nullptr, "release() before any hold()");
  __atomic_store_n(&host_gate->released, generation, __ATOMIC_SEQ_CST);
}

// Whether the newest hold()'s spin gave up before release(); read it once the stream has synchronized.
bool timed_out() {
  return host_gate != nullptr && __atomic_load_n(&host_gate->timed_out, __ATOMIC_SEQ_CST) == generation;
}

}  // namespace

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("hold", &hold, "launch the spin that holds the current stream until release()", py::arg("timeout_ns"));
  m.def("release", &release, "let the newest held spin end");
  m.def("timed_out", &timed_out, "whether the newest spin gave up (after the stream synchronized)");
}
