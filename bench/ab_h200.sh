#!/usr/bin/env bash
# A/B of trees on the GPU machine: A is this tree, B each tree listed in $B_SRC (git archives of
# other commits under .device/, which travel with carry [".device"]), all built for 90a-real;
# each B's CUDA suites, golden cases and sanitizers; then all timed alternately beside torch
# (ViT-B/16 and N 1024-16384), with the bias rows. From the project root:
#   here:   for b in BRANCH...; do rm -rf .device/$b && mkdir .device/$b &&
#             git archive $b | tar -x -C .device/$b; done
#   device: B_SRC=".device/x .device/y" STEPS="build test" bash bench/ab_h200.sh, then at once
#           (a machine stays warm 30 s) STEPS=bench with the same B_SRC.
# Bench knobs: ROUNDS (1), SEQLENS (1024,4096,16384), DIMS (64,128), PASS (both | forward),
# BIAS (1: the bias rows too), VIT (1: the ViT-B/16 row too). Trees are A, B1, B2, ... in the
# output, B_SRC's order.
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
for f in .device/debs/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
STEPS=${STEPS:-build test bench}
read -r -a bsrc <<<"${B_SRC:-.device/b-src}"
labels=(A); for i in "${!bsrc[@]}"; do labels+=("B$((i + 1))"); done
src_of() { if [ "$1" = A ]; then echo .; else echo "${bsrc[$((${1#B} - 1))]}"; fi; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
cfg() { cmake -S "$1" -B "$2" -DATTN_WITH_CUDA=ON -DATTN_WITH_OPENCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90a-real \
          -DATTN_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/cfg-$(basename "$2").log" 2>&1; }
if has build; then
  stamp build
  jobs=$(( $(nproc) / ${#labels[@]} )); [ "$jobs" -ge 2 ] || jobs=2
  for L in "${labels[@]}"; do
    [ -f "/tmp/b$L/CMakeCache.txt" ] || cfg "$(src_of "$L")" "/tmp/b$L"
    if [ "$L" = A ]; then targets=(--target attn attn_cli); else targets=(); fi
    (cmake --build "/tmp/b$L" -j"$jobs" "${targets[@]}" >"$OUT/b$L.log" 2>&1 ||
       { echo "$L build FAILED"; grep -m10 error "$OUT/b$L.log"; }) &
  done
  wait
fi
if has test; then
  for L in "${labels[@]:1}"; do
    stamp "test $L ($(src_of "$L"))"
    timeout 200 ctest --test-dir "/tmp/b$L" -j6 --timeout 190 --output-on-failure \
      -R "(inference|golden|reference|determinism|selection|hostile|lse|tf32)_cuda|archs" >"$OUT/ctest-$L.log" 2>&1
    echo "ctest rc $?"; grep -E "tests passed|tests failed|FAILED|\*\*\*" "$OUT/ctest-$L.log" | head -20
    ATTN_BACKEND=cuda timeout 30 "/tmp/b$L/tools/attn" check >"$OUT/golden-$L.txt" 2>&1
    echo "golden: $(tail -1 "$OUT/golden-$L.txt")"
    (cd "$(src_of "$L")" && OUT=$OUT/san-$L BUILD=/tmp/b$L ONLY=hopper STEPS="memcheck racecheck synccheck" \
       timeout 150 bash bench/cuda_sanitize.sh 2>&1 | grep -E "^(memcheck|racecheck|synccheck)" | cut -c1-100)
  done
fi
if has bench; then
  stamp bench
  pass=(); [ "${PASS:-both}" = forward ] && pass=(--forward-only)
  for _ in $(seq "${ROUNDS:-1}"); do for L in "${labels[@]}"; do
    echo "-- $L"
    if [ "${VIT:-1}" = 1 ]; then
      timeout 60 python3 bench/cuda_bench.py bench "/tmp/b$L/libattn.so" --dtypes bf16 --seqlens 197 \
        --tokens 12608 --dims 64 "${pass[@]}" 2>&1 | grep -E "^bf16"
    fi
    timeout 230 python3 bench/cuda_bench.py bench "/tmp/b$L/libattn.so" --dtypes bf16 \
      --seqlens "${SEQLENS:-1024,4096,16384}" --dims "${DIMS:-64,128}" --budget-s 200 "${pass[@]}" 2>&1 |
      grep -E "^bf16"
  done; done
  if [ "${BIAS:-1}" = 1 ]; then
    for L in "${labels[@]}"; do echo "-- bias $L"; ATTN=/tmp/b$L/tools/attn ROUNDS=1 timeout 60 bash bench/bias_prefill.sh
      for n in 300 197; do echo "unaligned bias N $n: $("/tmp/b$L/tools/attn" run --backend cuda --dtype f16 --batch 32 \
        --seqlen $n --heads 16 --dim 128 --bias keys --sinks --repeat 20 --no-check 2>&1 | grep -oE "forward +[0-9.]+ ms")"; done
    done
  fi
fi
stamp end
