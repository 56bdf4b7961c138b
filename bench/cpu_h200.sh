#!/usr/bin/env bash
# The CPU backend's target rows on the GPU machine's host CPU, beside PyTorch's
# CPU SDPA (torch installed there): builds the CPU backend alone into build-cpu,
# checks the golden cases on it, says which bf16 products the plan chose, then
# times f32 forward and backward at ViT-B/16 batch 64, N = 4096 d = 64 (causal
# and not) and N = 2048 d = 128, and the bf16 forward on the same rows, on all
# cores (attn run's timing; torch timed the same way, see cpu_bench.py). The
# table says each ratio to torch and whether it meets its target. Under 8
# minutes on 16 cores. From the project root:
#
#   bash bench/cpu_h200.sh              # build, check, time: the table last
#   TUNE=1 bash bench/cpu_h200.sh       # attn tune first (f32 and bf16, d = 64
#                                       # and 128), the rows then run its tiles
#
# Where cmocka is installed (on the GPU machine: ../shared/device/stage.sh,
# carry .device, unpack its debs first), test_products also runs the bf16
# kernels this CPU has natively (AVX512_BF16, AMX) against the golden cases.
#
# Logs go to $OUT (default /tmp/cpu_h200): build.log, check.log, products.log,
# tune.log, bench.log, and targets.json.
set -u -o pipefail
OUT=${OUT:-/tmp/cpu_h200}
mkdir -p "$OUT"
BUILD=${BUILD:-build-cpu}
JOBS=$(nproc)
T0=$(date +%s)
step() { printf '== %s (%ds)\n' "$1" $(($(date +%s) - T0)); }

step "build ($BUILD, CPU backend only)"
if ! { cmake -S . -B "$BUILD" -DATTN_WITH_CUDA=OFF -DATTN_WITH_OPENCL=OFF -DATTN_BUILD_TESTS=OFF \
         -DCMAKE_BUILD_TYPE=Release && cmake --build "$BUILD" -j "$JOBS" --target attn_cli; } \
       > "$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"
  exit 1
fi
# Which OpenBLAS: its pthreads build's pool spins beside attn's threads for a
# while after each process starts (CMakeLists.txt), so the rows are taken with
# its OpenMP build where the machine has it (Debian's libopenblas-openmp-dev).
grep -E "CPU bf16 products|OpenBLAS: " "$OUT/build.log"
ATTN=$BUILD/tools/attn
grep -m1 "model name" /proc/cpuinfo
grep -m1 -o -w -E "avx512_bf16|amx_bf16|avx512f|avx512_fp16" /proc/cpuinfo | sort -u | tr '\n' ' '; echo

step "golden cases on the CPU backend"
ATTN_BACKEND=cpu "$ATTN" check > "$OUT/check.log" 2>&1
echo "check exit $?: $(tail -1 "$OUT/check.log")"

if pkg-config --exists cmocka 2>/dev/null; then
  step "test_products (the bf16 and f32 kernels, natively where the CPU has them)"
  if cmake -S . -B "$BUILD" -DATTN_BUILD_TESTS=ON >> "$OUT/build.log" 2>&1 &&
     cmake --build "$BUILD" -j "$JOBS" --target test_products >> "$OUT/build.log" 2>&1; then
    { "$BUILD/tests/test_products" --common; "$BUILD/tests/test_products" --backend cpu; } \
      > "$OUT/products.log" 2>&1
    grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" "$OUT/products.log"
  else
    echo "test_products did not build (see $OUT/build.log)"
  fi
else
  echo "(cmocka absent: test_products not run)"
fi

# The cache folder of attn tune's tiles: this run's own unless TUNE=1 keeps them.
export ATTN_CL_CACHE_DIR=${ATTN_CL_CACHE_DIR:-$OUT/cache}
if [ "${TUNE:-0}" = 1 ]; then
  step "attn tune (f32, bf16; d = 64, 128)"
  ATTN_BACKEND=cpu "$ATTN" tune --dtype f32,bf16 --dim 64,128 > "$OUT/tune.log" 2>&1
  echo "tune exit $?; kept:"
  cat "$ATTN_CL_CACHE_DIR"/tiles-cpu-*.txt 2>/dev/null
fi

step "the plan's choice"
ATTN_DEBUG=1 ATTN_BACKEND=cpu "$ATTN" run --batch 1 --seqlen 256 --heads 2 --dim 64 --dtype bf16 \
  --repeat 1 --no-check 2>&1 | grep -m1 "forward: cpu"

step "target rows"
"${PYTHON:-python3}" bench/cpu_bench.py targets --attn "$ATTN" --repeat "${REPEAT:-7}" \
  --log "$OUT/bench.log" --json "$OUT/targets.json"
step "done"
