#!/usr/bin/env bash
# One call on the lent GPU: install, then the steps named on the command line, each logged under $OUT.
#   bash scripts/gpu_session.sh smoke            build + test + bench the registry, fault fixtures
#   STEPS are functions below; logs land in $OUT/<step>.log, JSON records in $OUT/*.json
set -uo pipefail
OUT=${OUT:-/tmp/flashcore-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLASHCORE_CACHE=${FLASHCORE_CACHE:-/tmp/flashcore-cache}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1

step() {  # step NAME COMMAND...: run, tee to $OUT/NAME.log, report rc
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT/$name.log"
  echo "=== $name rc=${PIPESTATUS[0]} ($((SECONDS - t0)) s)"
}

smoke() {
  step build-cold flashcore build baseline
  step build-cached flashcore build baseline
  step test-baseline flashcore test baseline --json "$OUT/test-baseline.json"
  step test-faults flashcore --registry tests/fixtures/faults.yaml test --all --timeout 20 --shapes "1,2,64,64"
  step bench-mission flashcore bench baseline --shape 1,8,512,64 --json "$OUT/bench-mission.json"
}

for s in "$@"; do "$s"; done
