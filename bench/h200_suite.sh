#!/usr/bin/env bash
# The whole test suite with every backend built (CUDA, NVIDIA's OpenCL, PoCL)
# on the H200 machine, the golden generator's PyTorch cross-check, and the
# speed of this tree against a base tree, in one call. From the project root:
#
#   ../shared/device/stage.sh --no-golden     # here: cmocka packages into .device/
#   git archive --prefix=base/ BASE | tar -x -C .device    # here: the base tree
#   bash bench/h200_suite.sh                  # there (carry: [".device"]); logs under $OUT
#
# STEPS picks what runs (default all): build ctest golden torch ab.
set -u -o pipefail
OUT=${OUT:-/tmp/attn-out}
mkdir -p "$OUT"
STEPS=${STEPS:-build ctest golden torch ab}
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
  cfg . build-h200 >"$OUT/configure.log" 2>&1 && cmake --build build-h200 -j12 >"$OUT/build.log" 2>&1 &
  pid=$!
  if [ -d .device/base ] && has ab; then
    (cfg .device/base build-base -DATTN_BUILD_TESTS=OFF && cmake --build build-base -j4 --target attn_cli) \
      >"$OUT/build_base.log" 2>&1 || echo "base build FAILED"
  fi
  wait $pid && echo "build ok" || { echo "build FAILED"; grep -m20 -E "error" "$OUT/build.log"; }
fi
build-h200/tools/attn info --selftest 2>&1 | tail -12

if has ctest; then
  stamp ctest
  ctest --test-dir build-h200 -j4 --output-on-failure >"$OUT/ctest.log" 2>&1
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run" "$OUT/ctest.log" | head -30
  grep -E "Skipped" "$OUT/ctest.log" | head -20
fi

if has golden; then
  stamp golden
  for be in cuda opencl; do
    ATTN_BACKEND=$be build-h200/tools/attn check >"$OUT/golden_$be.txt" 2>&1
    echo "golden $be: $(tail -1 "$OUT/golden_$be.txt")"
    grep -E "FAIL|cannot" "$OUT/golden_$be.txt" | head -10
    grep -A4 -E "^logits" "$OUT/golden_$be.txt" | head -40
  done
fi

if has torch && [ -f tests/golden/gen.py ]; then
  stamp torch
  rm -rf /tmp/golden_torch
  python3 tests/golden/gen.py --torch --out /tmp/golden_torch \
    >"$OUT/torch.log" 2>&1
  echo "gen.py --torch: exit $?"; tail -40 "$OUT/torch.log"
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
    [ "$mask" = causal ] && flag=--causal || flag=
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
cuda bf16 8192 64 causal
cuda bf16 8192 128 none
cuda bf16 8192 128 causal
cuda f16 8192 128 causal
opencl f32 4096 64 none
opencl f32 4096 128 causal
cpu f32 1024 64 none
CONFIGS
fi
stamp done
