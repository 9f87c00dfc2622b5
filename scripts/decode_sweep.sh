#!/usr/bin/env bash
# decode_sweep.sh — the decode rung's knobs swept on the GPU at its five target shapes, through `flashcore tune`.
#
#   bash scripts/decode_sweep.sh          (from the repo root, after pip install --no-deps --no-build-isolation -e .)
#
# The knobs (-D, defaults = the shipped build; variants.yaml's decode `tune:` block): DECODE_SPLITS (0: the
# cost model; N: N splits), DECODE_RING_KB (the K/V ring per CTA), DECODE_MIN_BLOCKS, DECODE_KCOMBINE_TILES and
# DECODE_OVERHEAD_TILES (the cost model's constants). Per shape, two tune runs, every knob passed with --param
# (one left out would take all its declared values):
#   1. splits: the cost model's count (DECODE_SPLITS=0) against 2-3 forced counts around it, 96 KB ring;
#   2. ring:   DECODE_RING_KB=64 (two 32 KB stages at D = 128 instead of three) at the model's count.
# Not swept here: the constants (at these shapes they move one split count only: OVERHEAD_TILES=0 takes
# 16,64:8,1:16384 from 2 to 37 splits; every other value in 0..4 keeps 4/1/33/2/8, so forced counts cover what
# they can reach), DECODE_MIN_BLOCKS=3 (128 registers at D = 128: spills, the tuner skips it) and =1 (179 instead
# of 168 registers, still 2 CTAs/SM; only halves the plan's slots, which forced counts cover). Add them by hand:
#   python3 -m flashcore_cli tune decode --shape S --param DECODE_SPLITS=0 --param DECODE_RING_KB=96 \
#     --param DECODE_MIN_BLOCKS=1,2 --param DECODE_KCOMBINE_TILES=2 --param DECODE_OVERHEAD_TILES=0,2 --reps 100
#
# Cost: 9 distinct builds (splits 0 1 2 4 8 16 32 64 at 96 KB, and 0 at 64 KB), each ~20 s and built once: the
# build cache is keyed by the defines, not the shape, so a combination timed at a later shape is a cache hit;
# plus the binding (torch's headers) once on a fresh machine. 24 trials (19 splits + 5 ring), each a worker
# (torch import, 4-6 check cases, 10 + REPS cold calls), ~5-8 s when cached. The ptxas probes of all 9 run
# first, in parallel, in one dry run (~30 s), so the per-shape runs find them cached. Estimate on an H200:
# 30 s probes + ~45 s binding + 9 x 20 s builds + 24 x ~6 s trials + 10 x ~3 s per tune run ~ 7 minutes.
#
# Logs: ${LOGS:-/tmp/decode-sweep}/<NN>-<shape>-<run>.log (each command's whole output), records/<shape>/<run>/
# (each run's JSON record: every candidate's defines, status, median and p10-p90), summary.txt (the table printed
# last). A second sweep into the same folder replaces the records (the logs are overwritten run by run).
#
# The stored winner: every tune run stores its fastest combination for this GPU model in
# <cache>/tuned/decode/<gpu>.json, and every later `flashcore build/test/bench decode` on this GPU builds with
# it. Inside the sweep it leaks nowhere (trials build with exactly their own defines, ignoring it), but after it
# the file would hold the last run's winner (the ring run at the last shape: one shape's pick, meaningless for
# the others). This is a throwaway machine, but the script still moves that file into the logs at the end and
# puts back any winner stored before it ran, so a bench of decode afterwards measures the shipped defaults.
set -u -o pipefail

LOGS=${LOGS:-/tmp/decode-sweep}
ARCH=${ARCH:-sm_90}
REPS=${REPS:-100}
TIMEOUT=${TIMEOUT:-90}  # seconds per trial after its build: a hung combination costs this, not tune's 600
FC=(python3 -m flashcore_cli)
mkdir -p "$LOGS"
rm -rf "$LOGS/records" "$LOGS/tuned-before" "$LOGS/tuned-by-sweep"  # an earlier sweep's, into the same folder
mkdir -p "$LOGS/records"
START=$(date +%s)
say() { printf '[%4ds] %s\n' $(($(date +%s) - START)) "$*"; }

# shape | forced split counts beside the model's (0) | what the model picks on 132 SMs x 2 (decode/decode.cu's header)
SHAPES=(
  "8,32:8,1:8192,128|2,8,16|4"
  "64,32:8,1:4096,128|2,4|1"
  "1,32:8,1:131072,128|16,32,64|33"
  "16,64:8,1:16384,128|1,4,8|2"
  "4,32:8,4:16384,128|4,16,32|8"
)
ALL_SPLITS=0,1,2,4,8,16,32,64  # the union of the above: what the dry run probes
DEFAULTS=(--param DECODE_MIN_BLOCKS=2 --param DECODE_KCOMBINE_TILES=2 --param DECODE_OVERHEAD_TILES=2)

TUNE=("${FC[@]}" tune)

# Any winner stored for decode before the sweep is kept aside and put back when the script exits, however it
# exits (Ctrl-C included); the sweep's own winners go to the logs (see the header).
TUNED=$(python3 -c 'from flashcore_cli.core.records import cache_root; print(cache_root() / "tuned" / "decode")')
if [ -d "$TUNED" ]; then
  cp -r "$TUNED" "$LOGS/tuned-before" && say "kept the stored decode winner(s) aside"
fi
restore_tuned() {
  if [ -d "$TUNED" ]; then
    mv "$TUNED" "$LOGS/tuned-by-sweep"
  fi
  if [ -d "$LOGS/tuned-before" ]; then
    cp -r "$LOGS/tuned-before" "$TUNED"
  fi
}
trap restore_tuned EXIT

slug() { echo "$1" | tr ':,' '-_'; }

# 0. every combination's ptxas probe at once (no GPU; cached for the runs below): registers, smem, spills.
say "ptxas probes of the $(( $(tr ',' '\n' <<<"$ALL_SPLITS" | wc -l) + 1 )) combinations (dry run)"
"${FC[@]}" tune decode --shape 8,32:8,1:8192,128 --arch "$ARCH" --dry-run --param DECODE_SPLITS=$ALL_SPLITS \
  --param DECODE_RING_KB=96 "${DEFAULTS[@]}" >"$LOGS/00-probes-ring96.log" 2>&1 || say "dry run (96 KB) failed: see $LOGS/00-probes-ring96.log"
"${FC[@]}" tune decode --shape 8,32:8,1:8192,128 --arch "$ARCH" --dry-run --param DECODE_SPLITS=0 \
  --param DECODE_RING_KB=64 "${DEFAULTS[@]}" >"$LOGS/00-probes-ring64.log" 2>&1 || say "dry run (64 KB) failed: see $LOGS/00-probes-ring64.log"

n=0
for entry in "${SHAPES[@]}"; do
  IFS='|' read -r shape forced model <<<"$entry"
  for run in splits ring; do
    n=$((n + 1))
    if [ $run = splits ]; then
      grid=(--param "DECODE_SPLITS=0,$forced" --param DECODE_RING_KB=96)
    else
      grid=(--param DECODE_SPLITS=0 --param DECODE_RING_KB=64)
    fi
    name=$(printf '%02d-%s-%s' $n "$(slug "$shape")" $run)
    records="$LOGS/records/$(slug "$shape")/$run"
    mkdir -p "$records"
    say "tune decode at $shape ($run: ${grid[*]})"
    FLASHCORE_RESULTS="$records" "${TUNE[@]}" decode --shape "$shape" --arch "$ARCH" --reps "$REPS" \
      --timeout "$TIMEOUT" "${grid[@]}" "${DEFAULTS[@]}" >"$LOGS/$name.log" 2>&1
    rc=$?
    [ $rc -ne 130 ] || { say "interrupted"; exit 130; }  # tune exits 130 on Ctrl-C, which bash would not stop on
    [ $rc -eq 0 ] || say "  exit $rc: see $LOGS/$name.log"
  done
done

say "done; summary:"
python3 - "$LOGS" "${SHAPES[@]}" <<'EOF' | tee "$LOGS/summary.txt"
"""Per shape: the shipped build (SPLITS=0, RING 96) and every other trial, median us, its GB/s, vs shipped."""
import json
import sys
from pathlib import Path

logs, entries = Path(sys.argv[1]), sys.argv[2:]
SHORT = {"DECODE_SPLITS": "S", "DECODE_RING_KB": "R", "DECODE_MIN_BLOCKS": "MB", "DECODE_KCOMBINE_TILES": "KC",
         "DECODE_OVERHEAD_TILES": "OH"}
SHIPPED = {"DECODE_SPLITS": 0, "DECODE_RING_KB": 96, "DECODE_MIN_BLOCKS": 2, "DECODE_KCOMBINE_TILES": 2,
           "DECODE_OVERHEAD_TILES": 2}


def gigabytes(shape: str) -> float:
    """Q, K, V read and O written once (bench's GB/s), fp16."""
    b, h, s, d = shape.split(",")
    hq, _, hkv = h.partition(":")
    sq, _, sk = s.partition(":")
    b, d, hq, sq = int(b), int(d), int(hq), int(sq)
    hkv, sk = int(hkv or hq), int(sk or sq)
    return 2 * (2 * b * hq * sq * d + 2 * b * hkv * sk * d) / 1e9


def label(defines: dict) -> str:
    changed = [f"{SHORT.get(k, k)}={v}" for k, v in defines.items() if SHIPPED.get(k) != v]
    return " ".join(changed) or "shipped"


print(f"{'shape (model splits)':<30} {'combination':<14} {'median us':>10} {'p10-p90 us':>14} {'GB/s':>6} {'vs shipped':>10}  status")
for entry in entries:
    shape, _, model = entry.split("|")
    rows = []
    for record in sorted((logs / "records" / shape.replace(":", "-").replace(",", "_")).glob("*/*.json")):
        for c in json.loads(record.read_text()).get("candidates", []):
            rows.append(c)
    if not rows:
        print(f"{shape + ' (' + model + ')':<30} no record: see the logs")
        continue
    shipped = next((c["timing"].get("median_us") for c in rows if label(c["defines"]) == "shipped" and c["timing"]), None)
    rows.sort(key=lambda c: (c["timing"].get("median_us") is None, c["timing"].get("median_us") or 0))
    for i, c in enumerate(rows):
        t = c["timing"]
        head = f"{shape} ({model})" if i == 0 else ""
        if t.get("median_us"):
            med = t["median_us"]
            vs = f"{shipped / med:.3f}x" if shipped else "-"
            print(f"{head:<30} {label(c['defines']):<14} {med:>10.1f} {t['p10_us']:>6.1f}-{t['p90_us']:<7.1f} "
                  f"{gigabytes(shape) / (med * 1e-6):>6.0f} {vs:>10}  OK" + ("  <- best" if i == 0 else ""))
        else:
            why = c.get("skipped") or f"{c.get('status')}: {(c.get('detail') or '').splitlines()[0][:60] if c.get('detail') else ''}"
            print(f"{head:<30} {label(c['defines']):<14} {'-':>10} {'-':>14} {'-':>6} {'-':>10}  {why}")
print("vs shipped: the shipped build's median / this one's. The R=64 row comes from another tune run than the")
print("shipped row: judge a small difference against both p10-p90 spreads. S: DECODE_SPLITS (0 = the model),")
print("R: DECODE_RING_KB; GB/s: Q, K, V read and O written once, as bench counts them.")
EOF
say "logs in $LOGS (summary.txt, one log per tune run, records/)"
