#!/usr/bin/env bash
# One call on the lent GPU: install, then the steps named on the command line.
#   bash scripts/gpu_session.sh smoke|ladder|shapes|stress|gputests ...
# Each step's output is printed and logged; logs and JSON records come back packed in $OUT/logs.tgz
# (the device returns only a few files). REGISTRY=path picks another registry.
set -uo pipefail
OUT=${OUT:-/tmp/flashcore-out}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" .' EXIT
export PYTHONUNBUFFERED=1 FLASHCORE_CACHE=${FLASHCORE_CACHE:-/tmp/flashcore-cache}
REG=${REGISTRY:-variants.yaml}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$LOGS/install.log" 2>&1 || { cat "$LOGS/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >"$LOGS/gpu.txt" 2>&1

step() {  # step NAME COMMAND...: run it, log it, report its exit code and time
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$LOGS/$name.log"
  echo "=== $name rc=${PIPESTATUS[0]} ($((SECONDS - t0)) s)"
}

smoke() {  # baseline end to end, and the hang/fault fixtures
  step build-cold flashcore build baseline
  step build-cached flashcore build baseline
  step test-baseline flashcore test baseline --json "$LOGS/test-baseline.json"
  step test-faults flashcore --registry tests/fixtures/faults.yaml test --all --timeout 20 --shapes "1,2,64,64"
  step bench-mission flashcore bench baseline --shape 1,8,512,64 --json "$LOGS/bench-mission.json"
}

ladder() {  # every variant: parallel build, the full default test set, bench at both issue shapes
  step build-all flashcore --registry "$REG" build --all
  step test-all flashcore --registry "$REG" test --all --timeout 120 --json "$LOGS/test-all.json"
  step bench-512 flashcore --registry "$REG" bench --all --shape 1,8,512,64 --json "$LOGS/bench-512.json"
  step bench-4096 flashcore --registry "$REG" bench --all --shape 2,16,4096,64 --reps 100 --json "$LOGS/bench-4096.json"
}

shapes() {  # the fast rungs at the other issue shapes, beside SDPA's backends and Triton
  step bench-4096-causal flashcore --registry "$REG" bench v8 v9 v10 v11 --shape 2,16,4096,64 --causal --reps 100 --json "$LOGS/bench-4096-causal.json"
  step bench-4096-d128 flashcore --registry "$REG" bench v8 v9 v10 v11 --shape 2,16,4096,128 --reps 100 --json "$LOGS/bench-4096-d128.json"
  step bench-4096-d128-causal flashcore --registry "$REG" bench v11 --shape 2,16,4096,128 --causal --reps 100 --json "$LOGS/bench-4096-d128-causal.json"
  step bench-512-causal flashcore --registry "$REG" bench v11 --shape 1,8,512,64 --causal --json "$LOGS/bench-512-causal.json"
}

stress() {  # issue 4: 2,000 random-shape launches each, every one checked, under a timeout
  step stress python3 scripts/stress.py v9 v10 --launches 2000 --timeout 400
}

sanitizers() {  # issue 4's sanitizer runs and issue 6's sanitize command
  export FLASHCORE_RESULTS=$LOGS/results
  step doctor flashcore doctor
  step sanitize-baseline flashcore sanitize baseline
  step sanitize-fault flashcore --registry tests/fixtures/faults.yaml sanitize fault --shape 1,2,64,64
  for v in v9 v10; do
    for tool in memcheck racecheck synccheck; do
      step "sanitize-$v-$tool" flashcore sanitize "$v" --tool "$tool" --shape 1,2,97,64 --causal
    done
  done
  step sanitize-v9-wide flashcore sanitize v9 --tool racecheck --shape 1,132,97,64
}

racecheck() {  # v9's pair merge after the bar.sync fix, small and wide shapes
  export FLASHCORE_RESULTS=$LOGS/results
  step sanitize-v9-racecheck flashcore sanitize v9 --tool racecheck --shape 1,2,97,64 --causal
  step sanitize-v9-racecheck-d128 flashcore sanitize v9 --tool racecheck --shape 1,2,97,128
}

instruments() {  # issue 6's other commands
  export FLASHCORE_RESULTS=$LOGS/results
  step profile-v11 flashcore profile v11 --shape 1,8,512,64
  step sass-v11 flashcore sass v11
  step sweep flashcore sweep v8 v9 v10 v11 --seq 512,1024,2048,4096 --reps 100 --plot "$OUT/sweep.png"
  step bench-a flashcore bench v10 v11 --reps 100
  step bench-b flashcore bench v10 v11 --reps 100
  step compare bash -c "flashcore compare \$(ls $LOGS/results/bench-*.json | tail -2 | tr '\n' ' ')"
  step tune-v10 flashcore tune v10 --param V10_BLOCK_N=64 --param V10_STAGES=2,3 --reps 100
  step ncu-csv bash -c "ncu --import \$(ls $LOGS/results/profile-*.ncu-rep | head -1) --csv --page details --print-units base"
}

tune_d128() {  # v11's D=128 long path: tune, then bench with the stored winner beside FA2
  export FLASHCORE_RESULTS=$LOGS/results
  step tune-v11-d128 flashcore tune v11 --shape 2,16,4096,128 --reps 100
  step bench-4096-d128-tuned flashcore bench v11 --shape 2,16,4096,128 --reps 100
}

v11check() {  # v11 after the cluster path: full test set, 2,000 random shapes, sanitizers on the cluster shapes
  export FLASHCORE_RESULTS=$LOGS/results
  step test-v11 flashcore test v11 --json "$LOGS/test-v11.json"
  step stress-v11 python3 scripts/stress.py v11 --launches 2000 --timeout 400
  for shape in 1,8,512,64 1,4,1000,64 1,4,1000,128; do
    for tool in memcheck racecheck; do
      step "sanitize-v11-$tool-$shape" flashcore sanitize v11 --tool "$tool" --shape "$shape"
    done
  done
  step sanitize-v11-synccheck flashcore sanitize v11 --tool synccheck --shape 1,8,512,64 --causal
}

final() {  # every bench table the issues ask for
  step bench-512 flashcore bench --all --shape 1,8,512,64 --json "$LOGS/bench-512.json"
  step bench-4096 flashcore bench --all --shape 2,16,4096,64 --reps 100 --json "$LOGS/bench-4096.json"
  shapes
}

v11final() {  # v11 after its last change, at every issue shape
  step test-v11 flashcore test v11 --json "$LOGS/test-v11.json"
  step stress-v11 python3 scripts/stress.py v11 --launches 2000 --timeout 400
  step bench-512-v11 flashcore bench v11 --shape 1,8,512,64
  step bench-512-causal-v11 flashcore bench v11 --shape 1,8,512,64 --causal
  step bench-4096-v11 flashcore bench v11 --shape 2,16,4096,64 --reps 100
  step bench-4096-causal-v11 flashcore bench v11 --shape 2,16,4096,64 --causal --reps 100
  step bench-4096-d128-v11 flashcore bench v11 --shape 2,16,4096,128 --reps 100
  step bench-4096-d128-causal-v11 flashcore bench v11 --shape 2,16,4096,128 --causal --reps 100
}

last() {  # v9 after its barrier fix; the commands the README shows
  export FLASHCORE_RESULTS=$LOGS/results
  step stress-v9 python3 scripts/stress.py v9 --launches 2000 --timeout 400
  step sanitize-v9-memcheck flashcore sanitize v9 --tool memcheck --shape 1,2,97,64 --causal
  step sanitize-v9-synccheck flashcore sanitize v9 --tool synccheck --shape 1,2,97,64 --causal
  step doctor flashcore doctor
  step build-v8-cold flashcore build v8 --force
  step build-v8-cached flashcore build v8
  step new flashcore new myv8 --from v8
  step test-new flashcore test myv8
}

v9check() {  # v9 after its barrier fixes: every sanitizer, the test set
  export FLASHCORE_RESULTS=$LOGS/results
  for tool in memcheck racecheck synccheck; do
    step "sanitize-v9-$tool" flashcore sanitize v9 --tool "$tool" --shape 1,2,97,64 --causal
  done
  step sanitize-v9-synccheck-d128 flashcore sanitize v9 --tool synccheck --shape 1,2,97,128
  step sanitize-v9-synccheck-wide flashcore sanitize v9 --tool synccheck --shape 1,132,97,64
  step test-v9 flashcore test v9
  step stress-v9 python3 scripts/stress.py v9 --launches 2000 --timeout 400
}

bench_v11_shapes() {  # v11 at every issue shape, one bench run each (used by the steps below)
  step bench-512-v11 flashcore bench v11 --shape 1,8,512,64
  step bench-512-causal-v11 flashcore bench v11 --shape 1,8,512,64 --causal
  for d in 64 128; do
    step "bench-4096-d$d-v11" flashcore bench v11 --shape "2,16,4096,$d" --reps 100
    step "bench-4096-d$d-causal-v11" flashcore bench v11 --shape "2,16,4096,$d" --causal --reps 100
  done
}

v11retile() {  # v11 after its new tiles (D=128 long: 48 keys; D=64 short: 4 groups x 32 keys): tests, stress,
               # sanitizers on both changed paths, bench at every issue shape
  export FLASHCORE_RESULTS=$LOGS/results
  step test-v11 flashcore test v11 --json "$LOGS/test-v11.json"
  step stress-v11 python3 scripts/stress.py v11 --launches 2000 --timeout 400
  for shape in 1,66,200,128 1,132,100,128; do  # B*H*ceil(S/128) >= 132 SMs: the long regime
    step "sanitize-v11-memcheck-$shape" flashcore sanitize v11 --tool memcheck --shape "$shape"
    step "sanitize-v11-memcheck-$shape-causal" flashcore sanitize v11 --tool memcheck --shape "$shape" --causal
  done
  step sanitize-v11-racecheck flashcore sanitize v11 --tool racecheck --shape 1,132,100,128
  step sanitize-v11-synccheck flashcore sanitize v11 --tool synccheck --shape 1,66,200,128 --causal
  for shape in 1,8,512,64 1,2,97,64; do  # the short regime at D=64
    for tool in memcheck racecheck synccheck; do
      step "sanitize-v11-$tool-$shape" flashcore sanitize v11 --tool "$tool" --shape "$shape" --causal
    done
  done
  bench_v11_shapes
}

v11short() {  # v11 after Q_i from global memory in the short kernels (and a 3-stage ring at D=64): tests,
              # stress, every sanitizer on the short regime at both head dims, bench at every issue shape
  export FLASHCORE_RESULTS=$LOGS/results
  step test-v11 flashcore test v11 --json "$LOGS/test-v11.json"
  step stress-v11 python3 scripts/stress.py v11 --launches 2000 --timeout 400
  for shape in 1,8,512,64 1,2,97,64 1,8,512,128 1,2,97,128; do  # B*H*ceil(S/128) < 132 SMs: short
    for tool in memcheck racecheck synccheck; do
      step "sanitize-v11-$tool-$shape" flashcore sanitize v11 --tool "$tool" --shape "$shape" --causal
    done
  done
  step sanitize-v11-memcheck-noncausal flashcore sanitize v11 --tool memcheck --shape 1,3,300,64
  bench_v11_shapes
}

v11_registry() {  # v11_registry FILE [NAME DEFINES SUMMARY]...: a one-off registry of v11 builds under out/
  local file=$1
  shift
  mkdir -p out  # (ignored by git; a registry's sources must lie inside the project)
  {
    echo 'variants:'
    while (($# >= 3)); do
      printf '%s\n' "  - name: $1" '    sources: [../kernels/v11.cu]' "    defines: $2" "    summary: \"$3\"" \
        '    head_dims: [64, 128]' '    causal: true'
      shift 3
    done
  } >"$file"
}

v11cluster() {  # v11 with its sm_90 cluster path built in (-D V11_CLUSTER=1), as a one-off registry entry
  export FLASHCORE_RESULTS=$LOGS/results
  v11_registry out/v11c.yaml v11c '{V11_CLUSTER: 1}' "v11 with the cluster split-K path on"
  export FLASHCORE_REGISTRY=$PWD/out/v11c.yaml
  step test-v11c flashcore test v11c
  step stress-v11c python3 scripts/stress.py v11c --launches 1000 --timeout 280
  for shape in 1,8,512,64 1,4,1000,128 1,2,97,64; do
    for tool in memcheck racecheck synccheck; do
      step "sanitize-v11c-$tool-$shape" flashcore sanitize v11c --tool "$tool" --shape "$shape" --causal
    done
  done
  step bench-512-v11c flashcore bench v11c --shape 1,8,512,64
  step bench-512-causal-v11c flashcore bench v11c --shape 1,8,512,64 --causal
  unset FLASHCORE_REGISTRY
}

v11tma() {  # v11 after the sm_90 TMA kernel for short D=64: tests, stress, sanitizers on its shapes, and
  # bench runs beside the same build with -D V11_TMA=0 (the cp.async kernel it replaces there)
  export FLASHCORE_RESULTS=$LOGS/results
  v11_registry out/v11tma.yaml v11 '{}' "v11 as registered" v11cp '{V11_TMA: 0}' "v11 with the TMA kernel off"
  local r="--registry out/v11tma.yaml"
  step build-v11 flashcore $r build v11 v11cp
  step ptxas-v11 flashcore ptxas v11
  step test-v11 flashcore test v11 --json "$LOGS/test-v11.json"
  step stress-v11 python3 scripts/stress.py v11 --launches 2000 --timeout 400
  for tool in memcheck racecheck synccheck; do
    step "sanitize-v11-$tool-512c" flashcore sanitize v11 --tool "$tool" --shape 1,8,512,64 --causal
  done
  step sanitize-v11-memcheck-1000 flashcore sanitize v11 --tool memcheck --shape 1,4,1000,64
  step sanitize-v11-memcheck-97c flashcore sanitize v11 --tool memcheck --shape 1,2,97,64 --causal
  step bench-512-tma flashcore $r bench v11 v11cp --shape 1,8,512,64
  step bench-512-causal-tma flashcore $r bench v11 v11cp --shape 1,8,512,64 --causal
  step bench-300-causal-tma flashcore $r bench v11 v11cp --shape 1,8,300,64 --causal
  step bench-2048-tma flashcore $r bench v11 v11cp --shape 1,4,2048,64
}

floor() {  # issue 5: v11 and SDPA beside kernels that do only part of v11's work (scripts/floor_v11.py)
  step floor-v11 python3 scripts/floor_v11.py --runs 3 --json "$LOGS/floor-v11.json"
  step bench-512-after-floor flashcore bench v11 --shape 1,8,512,64 --json "$LOGS/bench-512-after-floor.json"
}

gputests() {  # the gpu-marked pytest suite
  step pytest-gpu python3 -m pytest -q -m gpu -x
}

for s in "$@"; do "$s"; done
