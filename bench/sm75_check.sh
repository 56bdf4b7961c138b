#!/usr/bin/env bash
# The code a Turing GPU (sm_75) runs, checked on the GPU machine: the library built for compute_75
# PTX alone, which the driver compiles for the device present, so every kernel runs its sm_75 code
# (ATTN_DEBUG says "running code for 7.5"). There f16 takes the tensor-core rows (mma.sync m16n8k8)
# and bf16 the general kernels (its mma.sync begins at sm_80): the golden cases and the randomized
# check must pass on both, and f16 against bf16 on the same problem shows what the tensor cores give.
# Run from the repo root there:  bash bench/sm75_check.sh   (about 5 minutes)
set -u -o pipefail
OUT=${OUT:-/tmp/sm75-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-75}
t0=$(date +%s)
stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }

stamp build
cmake -S . -B "$BUILD" -DATTN_WITH_CUDA=ON -DATTN_WITH_OPENCL=OFF -DATTN_BUILD_TESTS=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=75-virtual >"$OUT/configure.log" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" --target attn_cli attn >"$OUT/build.log" 2>&1 ||
  { echo "build FAILED"; grep -m20 error "$OUT/build.log" "$OUT/configure.log"; exit 1; }
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
