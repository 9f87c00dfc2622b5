"""Is a backward row held by the GPU's power limit? A variant's backward and SDPA cuDNN's, each run back to back for a
few seconds (twice, alternating, an idle second before each), while NVML samples the SM clock, the board power and
the clock throttle reasons every 20 ms (0x4: the software power cap).

    python3 scripts/power_cap.py [VARIANT] [SHAPE] [--seconds S] [--causal]     (on a GPU; v12, 2,16,4096,128, 2.5)

Per run: microseconds per backward (CUDA events around all its calls), the mean SM clock after the first 0.2 s (and
over the first 0.3 s, the boost a short bench sees), its minimum, the mean and peak power, and how many samples gave
each throttle-reason mask. fp16 inputs; the variant needs `backward` (forward_train, then backward)."""
import argparse
import threading
import time

import pynvml
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashcore_cli.api import load_variant
from flashcore_cli.measure.references import sdpa_training_call
from flashcore_cli.measure.roofline import nvml_index
from flashcore_cli.registry.shapes import parse_shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant", nargs="?", default="v12")
    ap.add_argument("shape", nargs="?", default="2,16,4096,128")
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    s = parse_shape(args.shape)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(torch.cuda.current_device()))  # CUDA_VISIBLE_DEVICES
    print("power limit W", pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000)
    q = torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, device="cuda", dtype=torch.float16)
    k = torch.randn(s.batch, s.heads_kv, s.seq_len_kv, s.head_dim, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    attn = load_variant(args.variant)
    out, lse, res = attn.forward_train(q, k, v, causal=args.causal)
    d_o = torch.randn_like(out)

    def ours():
        attn.backward(d_o, q, k, v, out, lse, causal=args.causal, out_residual=res)

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # the bench's sdpa-cudnn row: bottom-right causal, grouped heads
        cudnn = sdpa_training_call(q, k, v, args.causal, "bwd", SDPBackend.CUDNN_ATTENTION)

    samples, stop = [], threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append((time.time(), pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                            pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))
            time.sleep(0.02)

    thread = threading.Thread(target=sampler)
    thread.start()
    try:
        for name, fn in ((args.variant, ours), ("cudnn", cudnn)) * 2:
            time.sleep(1.0)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0, calls = time.time(), 0
            start.record()
            while time.time() - t0 < args.seconds:
                for _ in range(10):
                    fn()
                calls += 10
                torch.cuda.synchronize()
            end.record()
            torch.cuda.synchronize()
            t1 = time.time()
            run = [x for x in samples if t0 + 0.2 <= x[0] <= t1]
            boost = [x[1] for x in samples if t0 <= x[0] <= t0 + 0.3]
            reasons: dict[int, int] = {}
            for x in run:
                reasons[x[3]] = reasons.get(x[3], 0) + 1
            mean = lambda xs: sum(xs) / max(len(xs), 1)
            print(f"{name}: {start.elapsed_time(end) / calls * 1000:.1f} us per backward over {calls}; SM clock mean "
                  f"{mean([x[1] for x in run]):.0f} MHz (first 0.3 s {mean(boost):.0f}), "
                  f"min {min((x[1] for x in run), default=0)}; power mean {mean([x[2] for x in run]):.0f} W, "
                  f"max {max((x[2] for x in run), default=0):.0f}; throttle reasons "
                  f"{{{', '.join(f'{r:#x}: {c}' for r, c in sorted(reasons.items()))}}}")
    finally:
        stop.set()
        thread.join()
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
