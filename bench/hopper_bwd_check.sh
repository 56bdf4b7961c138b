#!/usr/bin/env bash
# The Hopper backward (cuda/hopper_bwd.cu) on the H200: build, check, time. Run from the repo root
# there, carrying .device:
#
#   bash bench/hopper_bwd_check.sh                 # everything (about 8-9 minutes)
#   STEPS="build check golden" bash bench/hopper_bwd_check.sh   # or in two calls (the build
#   STEPS="pycheck bench" bash bench/hopper_bwd_check.sh        # is kept between them)
#
# Steps:
#   build    the library, the attn program and the test kit with the default architectures
#            (75-real 80-real 90a-real 90-virtual), and bench/hopper_bwd_check.cu against them
#   check    hopper_bwd_check: part 1 the backward's wgmma pieces alone (exact, small integers),
#            part 2 attn_backward against the float64 reference, the deterministic (tensor-core)
#            backward's error as the peer figure
#   golden   attn check on the repository's golden cases, forward and backward
#   pycheck  bench/cuda_bench.py check: randomized problems against a float64 reference, and
#            deterministic mode bit for bit twice (the tensor-core rows: the plan skips these)
#   bench    bench/cuda_bench.py bench: bf16, seqlens 4096 and 8192, d 64 and 128, causal or not,
#            forward and backward beside PyTorch's flash and cuDNN backends
# ATTN_DEBUG=1 logs the row each call ran: "backward: Hopper backward (wgmma) ..." for f16/bf16 at
# d = 64 and 128; "tensor-core backward" there means the sm_90a image was not loaded, or (for a
# deterministic call) the plan's skip. Logs go to $OUT; a summary is printed last.
set -u -o pipefail
OUT=${OUT:-/tmp/hopper-bwd-out}
mkdir -p "$OUT"
STEPS=${STEPS:-build check golden pycheck bench}
BUILD=${BUILD:-build}
# ARCHS=90a-real builds the sm_90a image alone (a third of the default build's time).
ARCHS=${ARCHS:-}
J=$(nproc)
t0=$(date +%s)
has() { [[ " $STEPS " == *" $1 "* ]]; }
stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
declare -A result

if [ -d .device/debs ]; then
  for f in .device/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

link_checker() {
  nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Icuda -Itestkit \
    bench/hopper_bwd_check.cu "$BUILD/testkit/libattn_testkit.a" "$BUILD/libattn.a" \
    $(pkg-config --libs openblas) -Xcompiler -fopenmp -ldl -lm -o "$BUILD/hopper_bwd_check" \
    >"$OUT/build_check.log" 2>&1
}

if has build; then
  stamp build
  if cmake -S . -B "$BUILD" -DATTN_WITH_CUDA=ON -DATTN_WITH_OPENCL=OFF -DATTN_BUILD_TESTS=OFF \
       ${ARCHS:+-DCMAKE_CUDA_ARCHITECTURES=$ARCHS} >"$OUT/configure.log" 2>&1 &&
     cmake --build "$BUILD" -j"$J" --target attn attn_cli attn_testkit attn_static \
       >"$OUT/build.log" 2>&1; then
    result[build]=ok
    if link_checker; then
      result[build]="ok (checker too)"
    else
      result[build]="ok, checker FAILED to build"
      tail -20 "$OUT/build_check.log"
    fi
  else
    result[build]=FAIL
    grep -m20 -E "error" "$OUT/build.log" "$OUT/configure.log"
  fi
  echo "build: ${result[build]}"
fi
ATTN=$BUILD/tools/attn

# Which image the driver loaded: the Hopper rows need "running code for 9.0a".
if [ -x "$ATTN" ]; then
  code=$(ATTN_DEBUG=1 ATTN_BACKEND=cuda "$ATTN" info --selftest 2>&1 | tee "$OUT/info.txt" |
    grep -o "running code for [0-9.a]*" | head -1)
  echo "device: $code"
  result[image]="$code"
fi

# The rows a log's calls ran, counted.
rows() { grep -o "ward: [^,]*" "$1" | sort | uniq -c | sed 's/^/    /'; }

if has check && [ -x "$BUILD/hopper_bwd_check" ]; then
  stamp check
  ATTN_DEBUG=1 timeout 150 "$BUILD/hopper_bwd_check" >"$OUT/check.txt" 2>"$OUT/check_debug.txt"
  rc=$?
  [ $rc = 0 ] && result[check]=ok || result[check]="FAIL (rc $rc)"
  cat "$OUT/check.txt"
  if [ $rc = 124 ]; then
    # A kernel that never finishes would hang every later step too.
    result[check]="HUNG (timed out after 150 s; later steps skipped)"
    STEPS=""
    tail -5 "$OUT/check_debug.txt"
  fi
  echo "rows the checker's calls ran:"
  rows "$OUT/check_debug.txt"
fi

if has golden && [ -x "$ATTN" ]; then
  stamp golden
  ATTN_DEBUG=1 ATTN_BACKEND=cuda timeout 120 "$ATTN" check tests/golden/cases >"$OUT/golden.txt" \
    2>"$OUT/golden_debug.txt" && result[golden]=ok || result[golden]=FAIL
  grep -E "FAIL|cannot" "$OUT/golden.txt" | head -20
  tail -3 "$OUT/golden.txt"
  echo "rows in the golden run:"
  rows "$OUT/golden_debug.txt"
fi

if has pycheck; then
  stamp pycheck
  ATTN_DEBUG=1 timeout 180 python3 bench/cuda_bench.py check "$BUILD/libattn.so" >"$OUT/pycheck.txt" \
    2>"$OUT/pycheck_debug.txt" && result[pycheck]=ok || result[pycheck]=FAIL
  grep -v "^{" "$OUT/pycheck.txt" | tail -25
  echo "backward rows in the randomized check:"
  grep -o "backward: [^,]*" "$OUT/pycheck_debug.txt" | sort | uniq -c | sed 's/^/    /'
fi

if has bench; then
  stamp bench
  ATTN_DEBUG=1 timeout 240 python3 bench/cuda_bench.py bench "$BUILD/libattn.so" --dtypes bf16 \
    --seqlens 4096,8192 --dims 64,128 --budget-s 150 --json "$OUT/bench.json" >"$OUT/bench.txt" \
    2>"$OUT/bench_debug.txt" && result[bench]=ok || result[bench]=FAIL
  grep -v "^{" "$OUT/bench.txt"
  echo "backward rows in the benchmark:"
  grep -o "backward: [^,]*" "$OUT/bench_debug.txt" | sort | uniq -c | sed 's/^/    /'
fi

stamp summary
for s in build image check golden pycheck bench; do
  [ -n "${result[$s]:-}" ] && printf "%-8s %s\n" "$s" "${result[$s]}"
done
exit 0
