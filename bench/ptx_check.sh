#!/usr/bin/env bash
# The code an older GPU runs, checked on the GPU machine: the library built for one architecture's PTX
# alone (ARCH: 75 Turing, the default; 80 Ampere; 60 Pascal, which needs a CUDA 11.8-12.x toolkit),
# which the driver compiles for the device present, so every kernel runs that architecture's code
# (ATTN_DEBUG says "running code for 7.5"). At 75, f16 takes the tensor-core rows (mma.sync m16n8k8)
# and bf16 the general kernels (its mma.sync begins at sm_80); at 80 both take the mma.sync rows (the
# A100's code); at 60 everything runs the general kernels. The golden cases and the randomized check
# must pass, and f16 against bf16 on the same problem shows what the tensor cores give.
# Run from the repo root there:  ARCH=75 bash bench/ptx_check.sh   (about 5 minutes)
# A library built elsewhere (another toolkit) is checked as it is: BUILD=dir with tools/attn and
# libattn.so in it, NO_BUILD=1.
set -u -o pipefail
ARCH=${ARCH:-75}
OUT=${OUT:-/tmp/ptx$ARCH-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-$ARCH}
t0=$(date +%s)
stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }

if [ "${NO_BUILD:-0}" = 0 ]; then
stamp build
cmake -S . -B "$BUILD" -DATTN_WITH_CUDA=ON -DATTN_WITH_OPENCL=OFF -DATTN_BUILD_TESTS=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=$ARCH-virtual >"$OUT/configure.log" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" --target attn_cli attn >"$OUT/build.log" 2>&1 ||
  { echo "build FAILED"; grep -m20 error "$OUT/build.log" "$OUT/configure.log"; exit 1; }
fi
ATTN=$BUILD/tools/attn
rows() { grep -o "ward: [^,]*, [a-z0-9]*" "$1" | sort | uniq -c | sed 's/^/    /'; }

stamp golden
ATTN_DEBUG=1 ATTN_BACKEND=cuda timeout 300 "$ATTN" check tests/golden/cases >"$OUT/golden.txt" \
  2>"$OUT/golden_debug.txt"
echo "golden rc $?: $(tail -1 "$OUT/golden.txt")"
grep -m1 -o "running code for [0-9.a]*" "$OUT/golden_debug.txt"
grep -E "FAIL" "$OUT/golden.txt" | head
rows "$OUT/golden_debug.txt"

stamp pycheck
ATTN_DEBUG=1 timeout 200 python3 bench/cuda_bench.py check "$BUILD/libattn.so" >"$OUT/pycheck.txt" \
  2>"$OUT/pycheck_debug.txt"
echo "pycheck rc $?"
grep -E "f16|bf16|check:" "$OUT/pycheck.txt" | grep -v "^{" | tail -10
rows "$OUT/pycheck_debug.txt"

stamp speed
# GFLOP/s of attn run (forward, backward), f16 (tensor cores) beside bf16 (general kernels).
for shape in "--dim 64 --heads 32 --batch 4 --seqlen 2048" "--dim 128 --heads 16 --batch 4 --seqlen 2048" \
  "--dim 64 --heads 32 --batch 4 --seqlen 2048 --causal"; do
  for dt in f16 bf16; do
    ATTN_DEBUG=1 timeout 100 "$ATTN" run --backend cuda --dtype $dt $shape --backward --repeat 10 \
      --no-check >"$OUT/run.txt" 2>"$OUT/run_debug.txt"
    printf "%-50s %-5s %s | %s\n" "$shape" $dt "$(grep -iE "gflop" "$OUT/run.txt" | tr '\n' ' ' | tr -s ' ')" \
      "$(grep -o "ward: [^,]*" "$OUT/run_debug.txt" | sort -u | tr '\n' ';')"
  done
done
for dt in f16 bf16; do
  ATTN_DEBUG=1 timeout 100 "$ATTN" run --backend cuda --dtype $dt --seqlen-q 1 --seqlen-k 32768 --heads 32 \
    --heads-kv 8 --dim 128 --batch 8 --repeat 20 --no-check >"$OUT/run.txt" 2>"$OUT/run_debug.txt"
  printf "%-50s %-5s %s | %s\n" "decode 8 x 32k, 32/8 heads, d 128" $dt \
    "$(grep -iE "gb/s|gflop" "$OUT/run.txt" | tr '\n' ' ' | tr -s ' ')" \
    "$(grep -o "ward: [^,]*" "$OUT/run_debug.txt" | sort -u | tr '\n' ';')"
done
stamp done
