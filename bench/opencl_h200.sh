#!/usr/bin/env bash
# The OpenCL backend on the H200 through NVIDIA's OpenCL, in one device call:
# build, self-test, golden cases, a forward tile sweep, the benchmark beside
# torch's float32 SDPA, then the test suite; the table comes last.
#
#   here, once:   ../shared/device/stage.sh        (cmocka into .device/)
#   device call:  bash bench/opencl_h200.sh         with carry [".device"]
#   or            bash bench/opencl_h200.sh quick   (golden + 4k benchmark only: no
#                                                    attn tune, no suite)
#   or            bash bench/opencl_h200.sh tune    (golden, attn tune, 4k benchmark
#                                                    with the tuned tiles; no suite)
#   or            bash bench/opencl_h200.sh suite   (golden + the suite only)
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

# The tiles: attn tune measures the table's variations and keeps the fastest for the runs below.
stamp tune
[ "$MODE" = quick ] || [ "$MODE" = suite ] || ATTN_BACKEND=opencl timeout 400 $A tune --dtype f32,f16 --dim 64,128 --seqlen 4096 >"$OUT/tune.txt" 2>&1

stamp bench
sizes=1024,4096,16384
[ "$MODE" = full ] || sizes=4096
[ "$MODE" = suite ] || python3 bench/opencl_bench.py --gpu --attn $A --log "$OUT/bench.log" --sizes $sizes \
  >"$OUT/bench.txt" 2>&1

stamp suite
[ "$MODE" = full ] || [ "$MODE" = suite ] && (cd $B && timeout 240 ctest -R "_opencl|opencl_without" -j4 --output-on-failure \
  >"$OUT/suite.txt" 2>&1)
grep -E "tests passed|Failed|Passed|Skipped|Timeout" "$OUT/suite.txt" | tail -12

stamp done
cat "$OUT/sweep.txt" | tail -1
sed -n '/^TFLOP/,$p' "$OUT/bench.txt"
