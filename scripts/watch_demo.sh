#!/usr/bin/env bash
# `flashcore watch` through the three edits a kernel author makes, on a GPU machine, from the repository root
# (after `python3 -m pip install --no-deps --no-build-isolation -e .`):
#   1. an edit that breaks the build (a syntax error): the compiler's first errors show, the watch goes on;
#   2. an edit that breaks correctness (the softmax scale off by 5%): MISMATCH with the first indices;
#   3. the original back: OK again, timed beside SDPA and the previous build.
# The variant is a copy of kernels/ladder/v8.cu in a scratch folder inside the project (removed at the end); the
# watch is stopped with SIGINT (Ctrl-C) and must exit 130. Prints every screen; exit 1 if a step never showed.
set -uo pipefail
set -m  # job control: the watch runs in a process group of its own, with SIGINT not ignored (a non-interactive
        # shell would start a background job with SIGINT ignored, and Ctrl-C could not reach it)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
dir=$(mktemp -d "$PWD/.watch-demo-XXXXXX")
trap 'kill -INT "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
cp kernels/ladder/v8.cu "$dir/demo.cu"
cp "$dir/demo.cu" "$dir/original.cu"
cat >"$dir/variants.yaml" <<'EOF'
variants:
  - name: demo
    sources: [demo.cu]
    summary: "a copy of v8, edited while flashcore watch runs"
    head_dims: [64, 128]
    causal: true
EOF
log="$dir/watch.log"
COLUMNS=140 "$PY" -m flashcore_cli --registry "$dir/variants.yaml" watch demo --shape 1,8,512,64 --bench --interval 0.5 \
  >"$log" 2>&1 &
pid=$!

failed=0
wait_screen() {  # wait_screen N WORD: until screen #N is printed and shows WORD (120 s at most)
  local n=$1 word=$2 t=0
  until grep -q "· #$n" "$log" && sed -n "/· #$n/,\$p" "$log" | grep -q "$word"; do
    sleep 1
    t=$((t + 1))
    if [ "$t" -ge 120 ] || ! kill -0 "$pid" 2>/dev/null; then
      echo "screen #$n never showed $word" >&2
      failed=1
      return 1
    fi
  done
  echo "screen #$n: $word"
}

wait_screen 1 OK
echo 'int this_does_not_compile = ;' >>"$dir/demo.cu"
wait_screen 2 BUILD-FAIL
"$PY" - "$dir/demo.cu" "$dir/original.cu" <<'EOF'
import sys
source = open(sys.argv[2]).read()
old = "case 64: return wmma_pipeline::launch<Tiles<64>>(v8_fwd<64>, p, stream);"
assert old in source, "kernels/ladder/v8.cu's launcher changed: update scripts/watch_demo.sh"
new = ("case 64: {  // the softmax scale 5% off: a wrong kernel\n"
       "      FlashcoreParams wrong = p;\n      wrong.scale *= 1.05f;\n"
       "      return wmma_pipeline::launch<Tiles<64>>(v8_fwd<64>, wrong, stream);\n    }")
open(sys.argv[1], "w").write(source.replace(old, new))
EOF
wait_screen 3 MISMATCH
cp "$dir/original.cu" "$dir/demo.cu"
wait_screen 4 OK
kill -INT "$pid"
for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$pid" 2>/dev/null; then
  echo "the watch did not stop within 15 s of SIGINT" >&2
  kill -KILL "$pid"
  failed=1
fi
wait "$pid"
rc=$?
echo "---- the watch's screens ----"
cat "$log"
echo "---- watch exit code after Ctrl-C: $rc (expected 130) ----"
[ "$rc" -eq 130 ] || failed=1
exit "$failed"
