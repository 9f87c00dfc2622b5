#!/usr/bin/env bash
# One call on the lent GPU: install, then the steps named on the command line.
#   bash scripts/gpu_session.sh smoke|ladder|house|wheel|shapes|check|stress|sanitizers|instruments|grads|bwdbench|v12bwd|v12pair|gputests|loop|familytests|familybench|densebench|familycheck|familyfinal ...
# VARIANTS="v9 v11" picks the variants of check, stress and sanitizers (default: v9 v10 v11).
# Each step's output is printed and logged; logs and JSON records come back packed in $OUT/logs.tgz
# (the device returns only a few files). REGISTRY=path picks another registry.
set -uo pipefail
OUT=${OUT:-/tmp/flashcore-out}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLASHCORE_CACHE=${FLASHCORE_CACHE:-/tmp/flashcore-cache}
# CACHE_IN=path.tgz starts from a cache an earlier call packed (CACHE_OUT=1: pack this call's into $OUT/cache.tgz)
if [ -n "${CACHE_IN:-}" ] && [ -f "$CACHE_IN" ]; then mkdir -p "$FLASHCORE_CACHE" && tar xzf "$CACHE_IN" -C "$FLASHCORE_CACHE"; fi
finish() {
  tar czf "$OUT/logs.tgz" -C "$LOGS" .
  if [ -n "${CACHE_OUT:-}" ]; then tar czf "$OUT/cache.tgz" -C "$FLASHCORE_CACHE" --exclude=./logs .; fi
}
trap finish EXIT
trap 'exit 143' TERM
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

smoke() {  # baseline end to end, the hang/fault fixtures, doctor
  step build-cold flashcore build baseline
  step build-cached flashcore build baseline
  step test-baseline flashcore test baseline --json "$LOGS/test-baseline.json"
  step test-faults flashcore --registry tests/fixtures/faults.yaml test --all --timeout 20 --shapes "1,2,64,64"
  step bench-mission flashcore bench baseline --shape 1,8,512,64 --json "$LOGS/bench-mission.json"
  step doctor flashcore doctor
}

ladder() {  # every variant: parallel build, the full default test set, bench at both issue shapes
  step build-all flashcore --registry "$REG" build --all
  step test-all flashcore --registry "$REG" test --all --timeout 120 --json "$LOGS/test-all.json"
  step bench-512 flashcore --registry "$REG" bench --all --shape 1,8,512,64 --json "$LOGS/bench-512.json"
  step bench-4096 flashcore --registry "$REG" bench --all --shape 2,16,4096,64 --reps 100 --json "$LOGS/bench-4096.json"
}

shapes() {  # the fast rungs at the other issue shapes (causal, D=128), beside SDPA's backends and Triton
  local fast="${VARIANTS:-v9 v10 v11}"
  step bench-512-causal flashcore --registry "$REG" bench $fast --shape 1,8,512,64 --causal --json "$LOGS/bench-512-causal.json"
  for d in 64 128; do
    step "bench-4096-d$d" flashcore --registry "$REG" bench $fast --shape "2,16,4096,$d" --reps 100 --json "$LOGS/bench-4096-d$d.json"
    step "bench-4096-d$d-causal" flashcore --registry "$REG" bench $fast --shape "2,16,4096,$d" --causal --reps 100 \
      --json "$LOGS/bench-4096-d$d-causal.json"
  done
}

stress() {  # 2,000 random-shape launches per variant, every one checked, under a timeout
  step stress python3 scripts/stress.py ${VARIANTS:-v9 v10 v11} --launches 2000 --timeout 600
}

sanitizers() {  # memcheck, racecheck and synccheck per variant at odd shapes, causal, both head dims
  export FLASHCORE_RESULTS=$LOGS/results
  step sanitize-fault flashcore --registry tests/fixtures/faults.yaml sanitize fault --shape 1,2,64,64
  for v in ${VARIANTS:-v9 v10 v11}; do
    for shape in 1,2,97,64 1,2,97,128; do
      for tool in memcheck racecheck synccheck; do
        step "sanitize-$v-$tool-$shape" flashcore --registry "$REG" sanitize "$v" --tool "$tool" --shape "$shape" --causal
      done
    done
  done
}

check() {  # after a kernel change: the default test set, stress and sanitizers for VARIANTS
  step test flashcore --registry "$REG" test ${VARIANTS:-v9 v10 v11} --json "$LOGS/test.json"
  stress
  sanitizers
}

instruments() {  # the instruments on v11: profile, sass, sweep, compare, tune (v10, narrowed)
  export FLASHCORE_RESULTS=$LOGS/results
  step profile-v11 flashcore profile v11 --shape 1,8,512,64
  step sass-v11 flashcore sass v11
  step sweep flashcore sweep v8 v9 v10 v11 --seq 512,1024,2048,4096 --reps 100 --plot "$OUT/sweep.png"
  step bench-a flashcore bench v10 v11 --reps 100
  step bench-b flashcore bench v10 v11 --reps 100
  step compare bash -c "flashcore compare \$(ls $LOGS/results/bench-*.json | tail -2 | tr '\n' ' ')"
  step tune-v10 flashcore tune v10 --param V10_BLOCK_N=64 --param V10_STAGES=2,3 --reps 100
}

grads() {  # v11 forward and backward: the default cases with gradients, the autograd GPU tests, a tiny transformer
  step test-v11 flashcore --registry "$REG" test v11 --json "$LOGS/test-v11.json"
  step pytest-autograd python3 -m pytest -q -m gpu tests/test_autograd.py tests/test_custom_op.py
  step train-tiny python3 scripts/train_tiny.py --steps ${TRAIN_STEPS:-300}
}

bwdbench() {  # v11's backward beside SDPA's backends (the backward alone), SHAPES="2,16,4096,64 ..." (causal too)
  for shape in ${SHAPES:-2,16,4096,64 2,16,4096,128}; do
    for causal in "" --causal; do
      step "bench-bwd-$shape$causal" flashcore --registry "$REG" bench ${VARIANTS:-v11} --pass bwd --shape "$shape" $causal \
        --reps 100 --json "$LOGS/bench-bwd-$shape$causal.json"
    done
  done
}

prevbench() {  # v11 beside the build before this session (.prev/variants.yaml, carried): forward, same run
  for shape in ${PREV_SHAPES:-1,8,512,64 2,16,4096,64 2,16,4096,128}; do
    step "bench-prev-$shape" flashcore --registry .prev/variants.yaml bench v11 v11prev --shape "$shape" --reps 100 \
      --json "$LOGS/bench-prev-$shape.json"
  done
}

v12pair() {  # issue 30's six rows, v12 timed in turn with cuDNN's (--pair sdpa-cudnn), PASSES="bwd fwd+bwd";
  # SPECS="2,16,4096,128;1,16,16384,128 --causal" picks rows
  local specs
  IFS=';' read -ra specs <<<"${SPECS:-2,16,4096,128;2,16,4096,128 --causal;2,16,4096,64;2,16,4096,64 --causal;1,16,16384,64;1,16,16384,128 --causal}"
  for pass in ${PASSES:-bwd fwd+bwd}; do
    for spec in "${specs[@]}"; do
      step "bench-pair-$pass-${spec// /}" flashcore --registry "$REG" bench v12 --pass "$pass" --shape $spec \
        --pair sdpa-cudnn --reps 100 --json "$LOGS/bench-pair-$pass-${spec// /}.json"
    done
  done
}

v12bwd() {  # v12's backward: its test cases (gradients checked), then the backward alone and fwd+bwd at issue 30's
  # rows beside v11's and SDPA's backends, one bench run per row
  step test-v12 flashcore test v12 --json "$LOGS/test-v12.json"
  for spec in "2,16,4096,64" "2,16,4096,64 --causal" "2,16,4096,128" "2,16,4096,128 --causal" "1,16,16384,64" \
              "1,16,16384,128 --causal"; do
    for pass in bwd fwd+bwd; do
      step "bench-$pass-${spec// /}" flashcore --registry "$REG" bench v12 v11 --pass "$pass" --shape $spec \
        --reps 100 --json "$LOGS/bench-$pass-${spec// /}.json"
    done
  done
}

house() {  # after a move of files: every variant built and checked (the default test set), the mission shape timed
  step build-all flashcore --registry "$REG" build --all
  step test-all flashcore --registry "$REG" test --all --timeout 120 --json "$LOGS/test-all.json"
  step bench-512 flashcore --registry "$REG" bench --all --shape 1,8,512,64 --json "$LOGS/bench-512.json"
}

wheel() {  # the wheel as a user installs it: built, installed beside this machine's torch, used from an empty folder
  local w
  w=$(mktemp -d)
  step wheel-build python3 -m pip wheel -q --no-deps --no-build-isolation -w "$w/dist" .
  step wheel-install python3 -m pip install -q --no-deps --target "$w/site" "$w"/dist/flashcore-*.whl
  mkdir "$w/own"
  (
    cd "$w/own" || exit 1
    export PYTHONPATH="$w/site"  # the wheel's flashcore_cli before the checkout's editable install
    step own-where python3 -c 'import flashcore_cli.core.paths as p; print(p.INSTALL_ROOT)'
    step own-new "$w/site/bin/flashcore" new mine --from v11
    step own-build "$w/site/bin/flashcore" build mine
    step own-test "$w/site/bin/flashcore" test mine --timeout 300 --json "$LOGS/own-test.json"
    step own-bench "$w/site/bin/flashcore" bench mine --shape 1,8,512,64 --json "$LOGS/own-bench.json"
    cp variants.yaml "$LOGS/own-variants.yaml"
  )
}

lanes() {  # lanes SPEC...: each spec "NAME|ARGS" a `flashcore bench` run, spread round-robin over the GPUs (one run
  # per GPU at a time, CUDA_VISIBLE_DEVICES), each run's rows from one GPU
  local n i=0 spec
  n=$(nvidia-smi -L | wc -l)
  local -a queue=("$@")
  for ((g = 0; g < n; g++)); do
    (
      export CUDA_VISIBLE_DEVICES=$g
      for ((j = g; j < ${#queue[@]}; j += n)); do
        spec=${queue[$j]}
        step "bench-${spec%%|*}" flashcore --registry "$REG" bench ${spec#*|} --reps 100 \
          --json "$LOGS/bench-${spec%%|*}.json" >"$LOGS/lane-$g-$j.out" 2>&1
      done
    ) &
  done
  wait
  cat "$LOGS"/lane-*.out
}

densespecs() {  # the record's dense rows (docs/results/h200.json): the mission shape, the six long shapes, decode's five
  local shape causal
  DENSE=("mission|${VARIANTS:-v12 v11} --shape 1,8,512,64")
  for shape in 2,16,4096,64 2,16,4096,128 1,16,16384,64; do
    for causal in "" --causal; do DENSE+=("$shape$causal|${VARIANTS:-v12 v11} --shape $shape $causal"); done
  done
  for shape in 8,32:8,1:8192,128 64,32:8,1:4096,128 1,32:8,1:131072,128 16,64:8,1:16384,128 4,32:8,4:16384,128; do
    DENSE+=("decode-$shape|decode --shape $shape")
  done
}

densebench() {  # the record's dense rows, spread over the GPUs
  densespecs
  lanes "${DENSE[@]}"
}

familybench() {  # issue 47's rows: v12 and v11 with windows 128/1024/4096, softcap 50, sinks, and plain causal (each
  # family row also times the variant without it: its "(plain)" row), forward and backward, beside FlexAttention
  local specs=() shape pass fam
  for shape in ${FAMILY_SHAPES:-1,16,16384,128 2,16,8192,64}; do
    for pass in ${PASSES:-fwd bwd}; do
      for fam in "causal|" "w128|--window 128,0" "w1024|--window 1024,0" "w4096|--window 4096,0" "softcap50|--softcap 50" \
                 "sinks|--sinks"; do
        specs+=("$shape-$pass-${fam%%|*}|${VARIANTS:-v12 v11} --shape $shape --causal --pass $pass ${fam#*|}")
      done
    done
  done
  # decode: a window of 4096 over a 131072-key cache (its plain row: the whole cache) beside a cache of the window's
  # 4097 keys, the same bytes
  specs+=("decode-w4096|decode --shape 1,32:8,1:131072,128 --causal --window 4096,0"
          "decode-4097|decode --shape 1,32:8,1:4097,128 --causal")
  if [ -n "${WITH_DENSE:-}" ]; then densespecs; specs+=("${DENSE[@]}"); fi
  lanes "${specs[@]}"
}

drain() {  # drain GPU QUEUE: take bench specs ("NAME|ARGS") off the shared queue file until it is empty, or until
  # BUDGET_S seconds of the session have gone (a run already started finishes)
  local g=$1 q=$2 spec
  export CUDA_VISIBLE_DEVICES=$g
  while [ "$SECONDS" -lt "${BUDGET_S:-100000}" ] && spec=$(flock "$q.lock" bash -c 'head -1 "$0"; sed -i 1d "$0"' "$q") &&
    [ -n "$spec" ]; do
    step "bench-${spec%%|*}" flashcore --registry "$REG" bench ${spec#*|} --reps 100 --json "$LOGS/bench-${spec%%|*}.json"
  done
}

familyfinal() {  # issue 47's last look: v12's and v11's checks (tests, stress, sanitizers under the family) on two GPUs,
  # then every GPU drains one queue of bench rows: the family's rows (v12; v11 too at 2,16,8192,64) and the dense record
  step build-family flashcore --registry "$REG" build v11 v12 decode
  local q="$LOGS/queue" shape pass fam v spec
  : >"$q"
  for shape in 1,16,16384,128 2,16,8192,64; do
    for pass in fwd bwd; do
      for fam in "causal|" "w128|--window 128,0" "w1024|--window 1024,0" "w4096|--window 4096,0" "softcap50|--softcap 50" \
                 "sinks|--sinks"; do
        v=v12; [ "$shape" = 2,16,8192,64 ] && [ "${fam%%|*}" != causal ] && [ "${fam%%|*}" != w128 ] && v="v12 v11"
        echo "$shape-$pass-${fam%%|*}|$v --shape $shape --causal --pass $pass ${fam#*|}" >>"$q"
      done
    done
  done
  VARIANTS="v12 v11" densespecs
  for spec in "${DENSE[@]}"; do [[ $spec == decode-* ]] || echo "$spec" >>"$q"; done  # decode: familybench's rows
  for v in v12 v11; do
    (export CUDA_VISIBLE_DEVICES=$([ $v = v12 ] && echo 0 || echo 1)
     step "test-$v" flashcore --registry "$REG" test $v --json "$LOGS/test-$v.json"
     step "stress-$v" python3 scripts/stress.py $v --launches "${LAUNCHES:-2000}" --timeout 300
     familysanitize "$v"
     drain "$CUDA_VISIBLE_DEVICES" "$q") >"$LOGS/lane-$v.out" 2>&1 &
  done
  (drain 2 "$q") >"$LOGS/lane-2.out" 2>&1 &
  (drain 3 "$q") >"$LOGS/lane-3.out" 2>&1 &
  wait
  cat "$LOGS"/lane-*.out
}

familytests() {  # the family's variants checked side by side on two GPUs (v12 and its GPU tests; v11 and decode)
  step build-family flashcore --registry "$REG" build v11 v12 decode
  (export CUDA_VISIBLE_DEVICES=0; step test-v12 flashcore --registry "$REG" test v12 --json "$LOGS/test-v12.json"
   step pytest-family python3 -m pytest -q -m gpu -n 0 tests/test_family_gpu.py) >"$LOGS/lane-0.out" 2>&1 &
  (export CUDA_VISIBLE_DEVICES=$(($(nvidia-smi -L | wc -l) > 1 ? 1 : 0))
   step test-v11 flashcore --registry "$REG" test v11 --json "$LOGS/test-v11.json"
   step test-decode flashcore --registry "$REG" test decode --json "$LOGS/test-decode.json") >"$LOGS/lane-1.out" 2>&1 &
  wait
  cat "$LOGS"/lane-*.out
}

familysanitize() {  # familysanitize VARIANT...: memcheck, racecheck and synccheck under a window, softcap and sinks
  local v tool
  export FLASHCORE_RESULTS=$LOGS/results
  for v in "$@"; do
    for tool in memcheck racecheck synccheck; do
      if [ "$v" = decode ]; then
        step "sanitize-$v-$tool" flashcore --registry "$REG" sanitize "$v" --tool "$tool" --shape 2,8:2,3:1000,128 \
          --causal --window 100,0 --sinks
      else
        step "sanitize-$v-$tool" flashcore --registry "$REG" sanitize "$v" --tool "$tool" --shape 2,4:2,97:130,64 --causal \
          --window 17,0 --softcap 30 --sinks
      fi
    done
  done
}

familycheck() {  # stress with random windows, softcaps and sinks; the sanitizers under the family
  step stress-family python3 scripts/stress.py ${VARIANTS:-v11 v12 decode} --launches ${LAUNCHES:-2000} --timeout 900
  familysanitize ${VARIANTS:-v11 v12 decode}
}

gputests() {  # the gpu-marked pytest suite
  step pytest-gpu python3 -m pytest -q -m gpu -x
}

loop() {  # the edit loop: its gpu tests (binding built once, edit/revert, two builders at once, watch's steps), then
  # the issue's timings table, three runs (scripts/loop_timings.sh restores kernels/sm80/v11.cu itself)
  step loop-gpu-tests python3 -m pytest -q -m gpu tests/test_loop_gpu.py
  step loop-timings env LOGS="$LOGS/loop-timings" bash scripts/loop_timings.sh
}

for s in "$@"; do "$s"; done
