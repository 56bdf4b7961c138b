#!/usr/bin/env bash
# The Hopper forward (cuda/hopper_fwd.cu) on the H200: build, check, time. Run from the repo root
# there, carrying .device:
#
#   bash bench/hopper_check.sh                       # everything (about 8-10 minutes)
#   STEPS="build check golden run" bash bench/hopper_check.sh   # first call
#   STEPS="time base" bash bench/hopper_check.sh                # second call (builds are kept)
#
# Steps:
#   build   the library and the attn program for 90a-real (build-hop), and
#           bench/hopper_check.cu against them
#   check   hopper_check: part 1 the wgmma/TMA building blocks alone (exact, small integers),
#           part 2 the library against the float64 reference (varlen, GQA, NaN in a
#           neighbour sequence, bhsd and fused-qkv strides, windows, softcap, ALiBi)
#   golden  attn check on the repository's golden cases (f16/bf16 d=64/128/256 ones reach
#           the Hopper rows)
#   run     attn run --check on f16/bf16 x d 64/96/128/256 x causal or not, with odd lengths
#   time    attn run --repeat 20 --no-check at batch 2, seqlen 4096, 16 heads
#   base    the same timings on a build without sm_90a (build-mma: the mma.sync rows)
# ATTN_DEBUG=1 logs the row each call ran ("Hopper forward (wgmma) ..." or "tensor-core
# forward ...").
# Logs go to $OUT; a table is printed last.
set -u -o pipefail
OUT=${OUT:-/tmp/hop-out}
mkdir -p "$OUT"
STEPS=${STEPS:-build check golden run time base}
BUILD=${BUILD:-build-hop}
BASE=${BASE:-build-mma}
J=$(nproc)
t0=$(date +%s)
has() { [[ " $STEPS " == *" $1 "* ]]; }
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
declare -A result

if [ -d .device/debs ]; then
  for f in .device/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

build_lib() { # dir archs log
  cmake -S . -B "$1" -DATTN_WITH_CUDA=ON -DATTN_WITH_OPENCL=OFF -DATTN_BUILD_TESTS=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$2" >"$3.configure" 2>&1 &&
    cmake --build "$1" -j"$J" --target attn_cli attn_testkit attn_static >"$3" 2>&1
}

if has build; then
  stamp build
  if build_lib "$BUILD" "90a-real" "$OUT/build.log"; then
    result[build]=ok
    # The same -Xptxas -v the library's kernels were checked with, for the record.
    nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cubin -Iinclude -Isrc -Icuda \
      -Xptxas -v cuda/hopper_fwd.cu -o "$OUT/hopper_fwd.cubin" >"$OUT/ptxas.txt" 2>&1
    grep -c HGMMA <(cuobjdump -sass "$OUT/hopper_fwd.cubin" 2>/dev/null) | sed 's/^/HGMMA in hopper_fwd.cu: /'
    grep -E "stack frame|C7508|serialized" "$OUT/ptxas.txt" | grep -v "^ *0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" | head -5
    if nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -Icuda -Itestkit \
         bench/hopper_check.cu "$BUILD/testkit/libattn_testkit.a" "$BUILD/libattn.a" \
         $(pkg-config --libs openblas) -Xcompiler -fopenmp -ldl -lm -o "$BUILD/hopper_check" \
         >"$OUT/build_check.log" 2>&1; then
      result[build]="ok (checker too)"
    else
      result[build]="ok, checker FAILED to build"
      tail -20 "$OUT/build_check.log"
    fi
  else
    result[build]=FAIL
    grep -m20 -E "error" "$OUT/build.log"
  fi
  echo "build: ${result[build]}"
fi
ATTN=$BUILD/tools/attn

# The image the driver loaded: the Hopper rows need "running code for 9.0a".
if has build && [ -x "$ATTN" ]; then
  code=$(ATTN_DEBUG=1 ATTN_BACKEND=cuda "$ATTN" info --selftest 2>&1 | tee -a "$OUT/info.txt" | grep -o "running code for [0-9.a]*" | head -1)
  echo "device: $code"
  result[image]="$code"
fi

if has check && [ -x "$BUILD/hopper_check" ]; then
  stamp check
  ATTN_DEBUG=1 "$BUILD/hopper_check" >"$OUT/check.txt" 2>"$OUT/check_debug.txt" && result[check]=ok || result[check]=FAIL
  cat "$OUT/check.txt"
  echo "rows the checker's calls ran:"
  grep -o "forward: [^,]*" "$OUT/check_debug.txt" | sort | uniq -c
fi

if has golden; then
  stamp golden
  ATTN_DEBUG=1 ATTN_BACKEND=cuda "$ATTN" check --forward-only tests/golden/cases >"$OUT/golden.txt" 2>"$OUT/golden_debug.txt" \
    && result[golden]=ok || result[golden]=FAIL
  grep -E "FAIL|cannot" "$OUT/golden.txt" | head -20
  tail -3 "$OUT/golden.txt"
  echo "Hopper rows in the golden run:"
  grep -o "forward: Hopper[^,]*" "$OUT/golden_debug.txt" | sort | uniq -c
fi

# One attn run: prints its row (ATTN_DEBUG) and its forward and error lines.
one_run() { # log-name args...
  local name=$1
  shift
  ATTN_DEBUG=1 "$ATTN" run --backend cuda "$@" >"$OUT/run_$name.txt" 2>&1
  local rc=$?
  local row=$(grep -o "forward: [^,]*" "$OUT/run_$name.txt" | head -1 | sed 's/forward: //')
  local fwd=$(grep -o "forward   .*" "$OUT/run_$name.txt" | sed 's/forward   //')
  local err=$(grep -o "error .*" "$OUT/run_$name.txt" | sed 's/error *//')
  printf "%-34s rc %d | %s | %s | %s\n" "$name" "$rc" "$row" "$fwd" "$err"
  return $rc
}

if has run; then
  stamp run
  ok=1
  for dt in f16 bf16; do
    for d in 64 96 128 256; do
      one_run "${dt}_d${d}" --dtype $dt --dim $d --batch 1 --seqlen 700 --heads 2 --check || ok=0
      one_run "${dt}_d${d}_causal" --dtype $dt --dim $d --batch 1 --seqlen-q 500 --seqlen-k 900 \
        --heads 2 --causal --check || ok=0
    done
  done
  one_run bf16_d128_gqa_window --dtype bf16 --dim 128 --batch 2 --seqlen 600 --heads 4 \
    --heads-kv 1 --window 100,30 --check || ok=0
  one_run f16_d64_softcap_alibi --dtype f16 --dim 64 --batch 1 --seqlen 777 --heads 4 \
    --softcap 30 --alibi --causal --check || ok=0
  one_run bf16_d128_long --dtype bf16 --dim 128 --batch 1 --seqlen 1536 --heads 2 --check || ok=0
  [ $ok = 1 ] && result[run]=ok || result[run]=FAIL
fi

declare -A tf
time_all() { # tag attn-program
  local tag=$1 prog=$2
  for dt in bf16 f16; do
    for d in 64 96 128 256; do
      for c in "" --causal; do
        local name="${dt}_d${d}${c:+_causal}"
        ATTN_DEBUG=1 "$prog" run --backend cuda --batch 2 --seqlen 4096 --heads 16 --dim $d \
          --dtype $dt $c --repeat 20 --no-check >"$OUT/time_${tag}_$name.txt" 2>&1
        tf[$tag,$name]=$(grep -o "[0-9.]* GFLOP/s" "$OUT/time_${tag}_$name.txt" | head -1 | awk '{printf "%.0f", $1/1000}')
        tf[$tag,$name,row]=$(grep -o "forward: [^,]*" "$OUT/time_${tag}_$name.txt" | head -1 | cut -c10-40)
        tf[$tag,$name,ms]=$(grep -o "forward   [0-9.]* ms" "$OUT/time_${tag}_$name.txt" | awk '{print $2}')
      done
    done
  done
}

if has time; then
  stamp time
  time_all hop "$ATTN"
fi

if has base; then
  stamp base
  if build_lib "$BASE" "90-real" "$OUT/build_base.log"; then
    time_all mma "$BASE/tools/attn"
  else
    echo "baseline build FAILED"
  fi
fi

stamp summary
for s in build image check golden run; do
  [ -n "${result[$s]:-}" ] && printf "%-7s %s\n" "$s" "${result[$s]}"
done
if has time || has base; then
  echo "forward, batch 2, seqlen 4096, 16 heads, median of 20 (TFLOP/s; ms; row)"
  printf "%-16s %22s %22s\n" case "this build (90a)" "sm_90 only (mma.sync)"
  for dt in bf16 f16; do
    for d in 64 96 128 256; do
      for c in "" _causal; do
        n="${dt}_d${d}${c}"
        printf "%-16s %6s %8s %-6s %6s %8s %s\n" "$n" "${tf[hop,$n]:--}" "${tf[hop,$n,ms]:--}" \
          "$(echo "${tf[hop,$n,row]:-}" | cut -c1-6)" "${tf[mma,$n]:--}" "${tf[mma,$n,ms]:--}" \
          "$(echo "${tf[mma,$n,row]:-}" | cut -c1-6)"
      done
    done
  done
fi
exit 0
