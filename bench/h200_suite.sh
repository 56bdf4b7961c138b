#!/usr/bin/env bash
# The whole test suite with every backend built (CUDA, NVIDIA's OpenCL, PoCL)
# on the H200 machine, the golden generator's PyTorch cross-check, and the
# speed of this tree against a base tree, in one call. From the project root:
#
#   ../shared/device/stage.sh --no-golden     # here: cmocka packages into .device/
#   git archive --prefix=base/ BASE | tar -x -C .device    # here: the base tree
#   bash bench/h200_suite.sh                  # there (carry: [".device"]); logs under $OUT
#
# STEPS picks what runs (default: build ctest envs golden torch ab); AB_ROWS
# (a regular expression on "backend dtype N d mask", mask one of none, causal,
# softcap, alibi) which rows ab times. envs runs the suites that depend on what
# is present with CUDA hidden (OpenCL only) and with the OpenCL library hidden
# (CUDA only). decode, asked for by name (STEPS="build decode", or "decode"
# alone, which builds only the program), is the decoding table of
# bench/decode_bench.py: attn beside torch's flash and cuDNN, paged caches, the
# device copy rate, NVIDIA OpenCL, the full-bias prefill; $OUT/decode.md and
# decode.json.
set -u -o pipefail
OUT=${OUT:-/tmp/attn-out}
# Logs go into one archive, $OUT/logs.tgz (the device tool brings back 8 files).
LOG=/tmp/attn-logs
mkdir -p "$OUT" "$LOG"
STEPS=${STEPS:-build ctest envs golden torch ab}
export PYTHONUNBUFFERED=1 ATTN_CL_CACHE_DIR=/tmp/attn-cl-cache
t0=$(date +%s)
has() { [[ " $STEPS " == *" $1 "* ]]; }
stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
cfg() { cmake -S "$1" -B "$2" -DATTN_WITH_CUDA=ON -DATTN_WITH_OPENCL=ON -DCMAKE_CUDA_ARCHITECTURES=90-real "${@:3}"; }

if [ -d .device/debs ]; then
  for f in .device/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader

if has build; then
  stamp build
  cfg . build-h200 >"$LOG/configure.log" 2>&1 && cmake --build build-h200 -j12 >"$LOG/build.log" 2>&1 &
  pid=$!
  if [ -d .device/base ] && has ab; then
    (cfg .device/base build-base -DATTN_BUILD_TESTS=OFF && cmake --build build-base -j4 --target attn_cli) \
      >"$LOG/build_base.log" 2>&1 || echo "base build FAILED"
  fi
  wait $pid && echo "build ok" || { echo "build FAILED"; grep -m20 -E "error" "$LOG/build.log"; }
fi
build-h200/tools/attn info --selftest 2>&1 | tail -12

if has ctest; then
  stamp ctest
  ctest --test-dir build-h200 -j4 --output-on-failure >"$LOG/ctest.log" 2>&1
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run" "$LOG/ctest.log" | head -30
  grep -E "Skipped" "$LOG/ctest.log" | head -20
fi

if has envs; then
  stamp envs
  sel="fallback|selection|opencl_without|cli|lse|faults|threads"
  n=0
  for env in "CUDA_VISIBLE_DEVICES=" "ATTN_CL_LIBRARY=/nonexistent/libOpenCL.so.1"; do
    n=$((n + 1))
    env "$env" build-h200/tools/attn info 2>&1 | grep selects
    env "$env" ctest --test-dir build-h200 -j4 -R "$sel" >"$LOG/ctest_env$n.log" 2>&1
    echo "$env: $(grep -E 'tests passed|tests failed' "$LOG/ctest_env$n.log")"
    grep -E "\*\*\*Failed|Timeout" "$LOG/ctest_env$n.log" | head
  done
fi

if has golden; then
  stamp golden
  for be in cuda opencl; do
    ATTN_BACKEND=$be build-h200/tools/attn check >"$LOG/golden_$be.txt" 2>&1
    echo "golden $be: $(tail -1 "$LOG/golden_$be.txt")"
    grep -E "FAIL|cannot" "$LOG/golden_$be.txt" | head -10
    grep -A4 -E "^logits" "$LOG/golden_$be.txt" | head -40
  done
fi

if has torch && [ -f tests/golden/gen.py ]; then
  stamp torch
  rm -rf /tmp/golden_torch
  python3 tests/golden/gen.py --torch --out /tmp/golden_torch \
    >"$LOG/torch.log" 2>&1
  echo "gen.py --torch: exit $?"; tail -40 "$LOG/torch.log"
  (cd /tmp/golden_torch && tar czf "$OUT/torch_cases.tgz" */case.json)
fi

if has ab && [ -x build-base/tools/attn ]; then
  stamp ab
  # Each configuration alternates base and this tree three times; the table
  # gives the median of the three medians and this tree's time over base's.
  run() { "$1" run --backend "$2" --batch "$3" --seqlen "$4" --heads 16 --dim "$5" --dtype "$6" $7 \
      --backward --no-check --repeat 15 2>&1 | awk '/^  forward/{f=$2} /^  backward/{b=$2} END{print f, b}'; }
  printf "%-7s %-5s %5s %4s %-7s %10s %10s %10s %10s %7s %7s\n" backend dtype N d mask \
    fwd_base fwd_new bwd_base bwd_new fwd_x bwd_x | tee "$OUT/ab.txt"
  while read -r be dt n d mask; do
    [[ "$be $dt $n $d $mask" =~ ${AB_ROWS:-.} ]] || continue
    case $mask in
      causal) flag=--causal ;;
      softcap) flag="--causal --softcap 30" ;; # the score transforms' kernels
      alibi) flag=--alibi ;;
      *) flag= ;;
    esac
    bs=$((16384 / n))
    fb=(); fn=(); bb=(); bn=()
    for rep in 1 2 3; do
      read -r f b < <(run build-base/tools/attn "$be" "$bs" "$n" "$d" "$dt" "$flag"); fb+=("$f"); bb+=("$b")
      read -r f b < <(run build-h200/tools/attn "$be" "$bs" "$n" "$d" "$dt" "$flag"); fn+=("$f"); bn+=("$b")
    done
    python3 - "$be" "$dt" "$n" "$d" "$mask" "${fb[*]}" "${fn[*]}" "${bb[*]}" "${bn[*]}" <<'PY' | tee -a "$OUT/ab.txt"
import statistics as s, sys
be, dt, n, d, mask = sys.argv[1:6]
fb, fn, bb, bn = (s.median(float(x) for x in a.split()) for a in sys.argv[6:10])
print(f"{be:7s} {dt:5s} {n:>5s} {d:>4s} {mask:7s} {fb:10.3f} {fn:10.3f} {bb:10.3f} {bn:10.3f} {fn/fb:7.3f} {bn/bb:7.3f}")
PY
  done <<'CONFIGS'
cuda f32 4096 64 none
cuda f32 4096 64 causal
cuda f32 4096 128 none
cuda f32 4096 128 causal
cuda bf16 8192 64 none
cuda bf16 8192 64 causal
cuda bf16 8192 128 none
cuda bf16 8192 128 causal
cuda f16 8192 128 causal
cuda bf16 4096 256 none
cuda f16 4096 96 causal
cuda bf16 8192 128 softcap
cuda f16 4096 96 alibi
opencl f32 4096 64 none
opencl f32 4096 128 causal
opencl f16 4096 64 causal
cpu f32 1024 64 none
cpu bf16 1024 128 causal
CONFIGS
fi
if has decode; then
  stamp decode
  if [ ! -x build-h200/tools/attn ]; then
    (cfg . build-h200 -DATTN_BUILD_TESTS=OFF && cmake --build build-h200 -j16 --target attn_cli) \
      >"$LOG/build_decode.log" 2>&1 || echo "decode: build FAILED"
  fi
  python3 bench/decode_bench.py --gpu --opencl --attn build-h200/tools/attn --json "$OUT/decode.json" \
    --log "$LOG/decode_runs.log" >"$LOG/decode.txt" 2>&1
  echo "decode_bench.py: exit $?"
  grep -v '^{' "$LOG/decode.txt" | tee "$OUT/decode.md"
fi
stamp done
tar czf "$OUT/logs.tgz" -C "$LOG" .
