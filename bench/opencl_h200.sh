#!/usr/bin/env bash
# The OpenCL backend on the H200 through NVIDIA's OpenCL, in one device call:
# build, self-test, golden cases, a forward tile sweep, the benchmark beside
# torch's float32 SDPA, then the test suite; the table comes last.
#
#   here, once:   ../shared/device/stage.sh        (cmocka into .device/)
#   device call:  bash bench/opencl_h200.sh         with carry [".device"]
#   or            bash bench/opencl_h200.sh quick   (golden + 4k benchmark only: no
#                                                    tile sweep, no suite)
#   or            bash bench/opencl_h200.sh tune    (golden, tile sweep, 4k benchmark
#                                                    with the best tiles; no suite)
#   or            bash bench/opencl_h200.sh suite   (golden + the suite only)
# SWEEP="BR,TM,BC,DK,JK ..." replaces the tile sweep's list; BENCH_DEFAULTS=1 benchmarks
# the default tiles instead of the sweep's best.
#
# Logs go to $OUT (the device tool brings them back). Results: bench/NOTES_opencl.md.
set -u -o pipefail
MODE=${1:-full}
OUT=${OUT:-$PWD/out-opencl-h200}
mkdir -p "$OUT"
B=build-opencl-h200
export ATTN_CL_CACHE_DIR=$PWD/$B/cl-cache
export PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

for f in .device/debs/*.deb; do dpkg -x "$f" / 2>/dev/null; done
ldconfig 2>/dev/null
stamp build
cmake -S . -B $B -DATTN_WITH_CUDA=OFF -DATTN_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release \
  >"$OUT/build.log" 2>&1 &&
  cmake --build $B -j16 >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
A=$B/tools/attn

stamp info
{ $A info --selftest; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } \
  2>&1 | tee "$OUT/info.txt"

stamp golden
ATTN_BACKEND=opencl $A check tests/golden/cases >"$OUT/golden.txt" 2>&1
echo "golden rc=$?: $(tail -1 "$OUT/golden.txt")"

# Forward tile sweep, f32, 4k tokens: BR,TM,BC,DK,JK (see cl/opencl.c).
stamp sweep
best64="" best128="" b64=0 b128=0
sweep=${SWEEP:-64,8,64,16,16 64,8,128,16,16 64,8,128,16,8 128,8,64,16,8 32,4,128,16,16 64,8,64,32,16}
[ "$MODE" = quick ] || [ "$MODE" = suite ] && sweep=""
for t in $sweep; do
  for d in 64 128; do
    g=$(ATTN_CL_TILES=$t timeout 60 $A run --backend opencl --batch 4 --seqlen 4096 \
      --heads $((2048 / d)) --dim $d --repeat 5 --no-check 2>&1 |
      sed -n 's/.*forward .* \([0-9.]*\) GFLOP\/s.*/\1/p')
    echo "tiles $t d $d fwd ${g:-fail} GFLOP/s" | tee -a "$OUT/sweep.txt"
    [ -n "$g" ] || continue
    if [ $d = 64 ] && awk "BEGIN{exit !($g > $b64)}"; then b64=$g best64=$t; fi
    if [ $d = 128 ] && awk "BEGIN{exit !($g > $b128)}"; then b128=$g best128=$t; fi
  done
done
echo "best d=64: $best64 ($b64), d=128: $best128 ($b128)" | tee -a "$OUT/sweep.txt"

stamp bench
# BENCH_DEFAULTS=1: the table with the library's default tiles, the sweep only reported.
[ "${BENCH_DEFAULTS:-0}" = 1 ] && best64="" best128=""
sizes=1024,4096,16384
[ "$MODE" = full ] || sizes=4096
[ "$MODE" = suite ] || python3 bench/opencl_bench.py --gpu --attn $A --log "$OUT/bench.log" --sizes $sizes \
  --tiles64 "$best64" --tiles128 "$best128" >"$OUT/bench.txt" 2>&1

stamp suite
[ "$MODE" = full ] || [ "$MODE" = suite ] && (cd $B && timeout 240 ctest -R "_opencl|opencl_without" -j4 --output-on-failure \
  >"$OUT/suite.txt" 2>&1)
grep -E "tests passed|Failed|Passed|Skipped|Timeout" "$OUT/suite.txt" | tail -12

stamp done
cat "$OUT/sweep.txt" | tail -1
sed -n '/^TFLOP/,$p' "$OUT/bench.txt"
