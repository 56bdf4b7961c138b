#!/usr/bin/env bash
# The OpenCL tensor-core kernels (cl/mma.cl, fwd_mma.cl, bwd_mma.cl: inline PTX) assemble for
# sm_80 and sm_90 in every dtype, head-dim bucket and feature set the plan
# builds them with, on a machine without an NVIDIA GPU: clang compiles the
# forward's and the backward's programs (common.cl, mma.cl, fwd_mma.cl;
# common.cl, bwd.cl, mma.cl, bwd_mma.cl) for the nvptx64 OpenCL target
# against libclc's builtins, and ptxas assembles the PTX, inline assembly
# included. NVIDIA's
# own OpenCL compiler is not here; this is the nearest check of the PTX
# operands and constraints. "" is the file's defaults, as the
# standalone-compile test builds it. Exits 77 (skipped) without clang, libclc's
# nvptx64 library or ptxas.
#   tests/cl_ptx_check.sh SOURCE_DIR [PTXAS]
set -u -o pipefail
src=${1:?source dir}
ptxas=${2:-ptxas}
command -v "$ptxas" >/dev/null 2>&1 || { echo "skipped: no ptxas"; exit 77; }
command -v clang >/dev/null 2>&1 || { echo "skipped: no clang"; exit 77; }
major=$(clang -dumpversion | cut -d. -f1)
clc=""
for f in "/usr/lib/llvm-$major/lib/clc/nvptx64--nvidiacl.bc" /usr/lib/clc/nvptx64--nvidiacl.bc \
         /usr/share/clc/nvptx64--nvidiacl.bc; do
  [ -f "$f" ] && { clc=$f; break; }
done
[ -n "$clc" ] || { echo "skipped: no libclc nvptx64 library (libclc-$major)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat "$src/cl/common.cl" "$src/cl/mma.cl" "$src/cl/fwd_mma.cl" >"$tmp/fwd.cl"
cat "$src/cl/common.cl" "$src/cl/bwd.cl" "$src/cl/mma.cl" "$src/cl/bwd_mma.cl" >"$tmp/bwd.cl"
cat "$src/cl/common.cl" "$src/cl/mma.cl" "$src/cl/decode_mma.cl" "$src/cl/split.cl" >"$tmp/dec.cl"
# One program with one set of options, for sm_80 and sm_90: job i's lines
# into $tmp/i.out, and $tmp/i.failed where it fails.
one() {
  local i=$1 prog=$2 v=$3 d="$tmp/$1" arch
  mkdir "$d"
  # -Dinline=: every function defined in the one translation unit, as
  # OpenCL compilers treat them (C99's inline alone would leave external
  # references to what clang does not inline).
  # shellcheck disable=SC2086
  if ! clang -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -Xclang -finclude-default-header \
      -Xclang -cl-ext=+cl_khr_fp16 -Xclang -target-cpu -Xclang sm_80 -O2 -Wno-linker-warnings \
      -Dinline= -Xclang -mlink-builtin-bitcode -Xclang "$clc" $v -S "$tmp/$prog.cl" \
      -o "$d/k.ptx" 2>"$d/clang.log"; then
    echo "FAIL clang $prog $v"; head -20 "$d/clang.log"; touch "$tmp/$i.failed"; return
  fi
  for arch in sm_80 sm_90; do
    if ! "$ptxas" -arch=$arch -v "$d/k.ptx" -o "$d/k.cubin" >"$d/ptxas.log" 2>&1; then
      echo "FAIL ptxas $arch $prog $v"; head -20 "$d/ptxas.log"; touch "$tmp/$i.failed"; continue
    fi
    echo "ok $arch $prog $v: $(grep -A4 -E "Compiling entry function '[a-z_]*_mma'" "$d/ptxas.log" |
      grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" | tr '\n' ' ')"
  done
}
# check PROGRAM OPTIONS...: the program with each set of options, as jobs,
# as many at once as there are processors (each is one clang and two ptxas).
n=0
width=$(nproc 2>/dev/null || echo 2)
check() {
  local prog=$1 v
  shift
  for v in "$@"; do
    # f32 forward and backward programs carry the NaN scan (launch.c).
    case "$prog $v" in "fwd " | "bwd " | fwd*-DDTYPE=0* | bwd*-DDTYPE=0*) v="$v -DNAN_FLAG=1" ;; esac
    n=$((n + 1))
    one "$n" "$prog" "$v" >"$tmp/$n.out" &
    while [ "$(jobs -rp | wc -l)" -ge "$width" ]; do wait -n; done
  done
}
check fwd "" "-DDTYPE=1 -DHD=32" "-DDTYPE=2 -DHD=64" "-DDTYPE=1 -DHD=96" "-DDTYPE=2 -DHD=128" \
  "-DDTYPE=2 -DHD=128 -DKV_USED=1 -DPAGED=1 -DHAS_BIAS=1 -DBIAS_DTYPE=2 -DHAS_SINKS=1" \
  "-DDTYPE=1 -DHD=64 -DSPLIT=1 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DKV_USED=1" \
  "-DDTYPE=1 -DHD=128 -DHAS_BIAS=1 -DBIAS_DTYPE=1" "-DDTYPE=2 -DHD=128 -DHAS_BIAS=1 -DBIAS_DTYPE=0" \
  "-DDTYPE=0 -DHD=32" "-DDTYPE=0 -DHD=32 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DSPLIT=1" \
  "-DDTYPE=0 -DHD=64 -DKV_USED=1 -DPAGED=1 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DHAS_SINKS=1" \
  "-DDTYPE=0 -DHD=64 -DHAS_BIAS=1 -DBIAS_DTYPE=2" "-DDTYPE=0 -DHD=128" \
  "-DDTYPE=0 -DHD=96 -DHAS_BIAS=1 -DBIAS_DTYPE=2" \
  "-DDTYPE=0 -DHD=128 -DKV_USED=1 -DPAGED=1 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DHAS_SINKS=1 -DSPLIT=1"
# The backward's MQ: the plan's attn__cl_mma_query_rows at each HD and bias dtype.
check bwd "" "-DDTYPE=1 -DHD=32 -DMQ=64" "-DDTYPE=2 -DHD=64 -DMQ=64" "-DDTYPE=2 -DHD=128 -DMQ=16" \
  "-DDTYPE=2 -DHD=128 -DMQ=16 -DHAS_BIAS=1 -DBIAS_DTYPE=2 -DDBIAS=2 -DHAS_SINKS=1" \
  "-DDTYPE=1 -DHD=96 -DMQ=32 -DHAS_BIAS=1 -DBIAS_DTYPE=1 -DDBIAS=1" \
  "-DDTYPE=2 -DHD=64 -DMQ=64 -DHAS_BIAS=1 -DBIAS_DTYPE=2 -DDBIAS=1" \
  "-DDTYPE=1 -DHD=64 -DMQ=32 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DDBIAS=1" \
  "-DDTYPE=2 -DHD=128 -DMQ=16 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DDBIAS=1" "-DDTYPE=0 -DHD=32 -DMQ=64" \
  "-DDTYPE=0 -DHD=32 -DMQ=32 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DDBIAS=2 -DHAS_SINKS=1" \
  "-DDTYPE=0 -DHD=64 -DMQ=16 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DDBIAS=1" \
  "-DDTYPE=0 -DHD=64 -DMQ=16 -DHAS_BIAS=1 -DBIAS_DTYPE=2 -DDBIAS=2" "-DDTYPE=0 -DHD=128 -DMQ=16 -DKR=32" \
  "-DDTYPE=0 -DHD=96 -DMQ=16 -DKR=32 -DHAS_BIAS=1 -DBIAS_DTYPE=0 -DDBIAS=2 -DHAS_SINKS=1" \
  "-DDTYPE=0 -DHD=128 -DMQ=16 -DKR=32 -DHAS_BIAS=1 -DBIAS_DTYPE=2 -DDBIAS=1"
check dec "-DDTYPE=2 -DHD=128 -DDR=16" "-DDTYPE=1 -DHD=32 -DDR=16" \
  "-DDTYPE=1 -DHD=64 -DDR=16 -DKV_USED=1 -DPAGED=1 -DHAS_SINKS=1" \
  "-DDTYPE=2 -DHD=96 -DDR=16 -DHAS_BIAS=1 -DBIAS_DTYPE=0" \
  "-DDTYPE=2 -DHD=128 -DDR=16 -DHAS_BIAS=1 -DBIAS_DTYPE=2 -DKV_USED=1"
wait
failed=0
for i in $(seq "$n"); do
  cat "$tmp/$i.out"
  [ -e "$tmp/$i.failed" ] && failed=1
done
exit $failed
