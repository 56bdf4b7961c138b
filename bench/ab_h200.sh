#!/usr/bin/env bash
# A/B of two trees on the GPU machine: A is this tree, B the tree at $B_SRC (a git archive of
# another commit under .device/, which travels with carry [".device"]), both built for 90a-real;
# B's CUDA suites, golden cases and sanitizers; then both timed alternately beside torch (forward
# and backward, ViT-B/16 and N 1024-16384), with the bias rows. From the project root:
#   here:   rm -rf .device/b-src && mkdir .device/b-src && git archive BRANCH | tar -x -C .device/b-src
#   device: STEPS="build test" bash bench/ab_h200.sh, then at once (a machine stays warm 30 s)
#           STEPS=bench bash bench/ab_h200.sh          (ROUNDS=1, SEQLENS=1024,4096,16384)
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
for f in .device/debs/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
STEPS=${STEPS:-build test bench}
B_SRC=${B_SRC:-.device/b-src}
has() { [[ " $STEPS " == *" $1 "* ]]; }
cfg() { cmake -S "$1" -B "$2" -DATTN_WITH_CUDA=ON -DATTN_WITH_OPENCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90a-real \
          -DATTN_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/cfg-$(basename "$2").log" 2>&1; }
if has build; then
  stamp build
  [ -f /tmp/bA/CMakeCache.txt ] || cfg . /tmp/bA
  [ -f /tmp/bB/CMakeCache.txt ] || cfg "$B_SRC" /tmp/bB
  (cmake --build /tmp/bA -j8 --target attn attn_cli >"$OUT/bA.log" 2>&1 || echo "A build FAILED") &
  cmake --build /tmp/bB -j8 >"$OUT/bB.log" 2>&1 || { echo "B build FAILED"; grep -m10 error "$OUT/bB.log"; }
  wait
fi
if has test; then
  stamp test
  timeout 200 ctest --test-dir /tmp/bB -j6 --timeout 190 --output-on-failure \
    -R "(inference|golden|reference|determinism|selection|hostile|lse|tf32)_cuda|archs" >"$OUT/ctest.log" 2>&1
  echo "ctest rc $?"; grep -E "tests passed|tests failed|FAILED|\*\*\*" "$OUT/ctest.log" | head -20
  ATTN_BACKEND=cuda timeout 30 /tmp/bB/tools/attn check >"$OUT/golden.txt" 2>&1; echo "golden: $(tail -1 "$OUT/golden.txt")"
  (cd "$B_SRC" && OUT=$OUT/san BUILD=/tmp/bB ONLY=hopper STEPS="memcheck racecheck synccheck" \
     timeout 150 bash bench/cuda_sanitize.sh 2>&1 | grep -E "^(memcheck|racecheck|synccheck)" | cut -c1-100)
fi
if has bench; then
  stamp bench
  for _ in $(seq "${ROUNDS:-1}"); do for L in A B; do
    echo "-- $L"
    timeout 60 python3 bench/cuda_bench.py bench /tmp/b$L/libattn.so --dtypes bf16 --seqlens 197 --tokens 12608 --dims 64 2>&1 | grep -E "^bf16"
    timeout 230 python3 bench/cuda_bench.py bench /tmp/b$L/libattn.so --dtypes bf16 --seqlens "${SEQLENS:-1024,4096,16384}" --dims 64,128 --budget-s 200 2>&1 | grep -E "^bf16"
  done; done
  for L in A B; do echo "-- bias $L"; ATTN=/tmp/b$L/tools/attn ROUNDS=1 timeout 60 bash bench/bias_prefill.sh
    for n in 300 197; do echo "unaligned bias N $n: $(/tmp/b$L/tools/attn run --backend cuda --dtype f16 --batch 32 \
      --seqlen $n --heads 16 --dim 128 --bias keys --sinks --repeat 20 --no-check 2>&1 | grep -oE "forward +[0-9.]+ ms")"; done
  done
fi
stamp end
