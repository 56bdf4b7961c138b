#!/usr/bin/env bash
# What limits a CUDA kernel, by Nsight Compute on the GPU machine: one launch of one family's kernel
# per problem (the second, after a warm-up call), its throughput against the SM's and memory's peaks,
# the tensor pipe's busy share, issue-slot use, the warps' stall reasons and the atomics that reach L2.
# Run from the repo root (the build is kept while the machine is warm):
#
#   bash bench/cuda_profile.sh                      # build-prof, then every problem below
#   ONLY=bwd_d128 STEPS=profile bash bench/cuda_profile.sh
#
# The full reports go to $OUT (default /tmp/profile-out) as NAME.ncu-rep (`ncu --import` reads them)
# and NAME.txt; the lines printed are the ones that say where the time goes.
set -u -o pipefail
OUT=${OUT:-/tmp/profile-out}
mkdir -p "$OUT"
STEPS=${STEPS:-build profile}
BUILD=${BUILD:-build-prof}
ARCHS=${ARCHS:-90a-real}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
ATTN_BIN=${ATTN:-$BUILD/tools/attn}
# Counters beside the sections: reductions (dQ's atomics) reaching L2, and the tensor path's bf16 ops
# (FLOP/s against the duration). A name this ncu does not know stops it: METRICS= leaves them out.
METRICS=${METRICS-lts__t_sectors_op_red.sum,sm__ops_path_tensor_src_bf16_dst_fp32.sum}
t0=$(date +%s)
has() { [[ " $STEPS " == *" $1 "* ]]; }
stamp() { echo "== $1 ($(($(date +%s) - t0)) s)"; }

if has build; then
  stamp build
  if cmake -S . -B "$BUILD" -DATTN_WITH_CUDA=ON -DATTN_WITH_OPENCL=OFF -DATTN_BUILD_TESTS=OFF \
       -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1 &&
     cmake --build "$BUILD" -j"$(nproc)" --target attn_cli >"$OUT/build.log" 2>&1; then
    echo "build: ok"
  else
    echo "build: FAILED"
    grep -m20 error "$OUT/build.log" "$OUT/configure.log"
    exit 1
  fi
fi

# name | kernel-name regex (the family's main kernel) | attn run arguments
problems=(
  "fwd_d128|fwd_ws_kernel|--dtype bf16 --batch 4 --seqlen 4096 --heads 16 --dim 128"
  "fwd_d128_causal|fwd_ws_kernel|--dtype bf16 --batch 4 --seqlen 4096 --heads 16 --dim 128 --causal"
  "fwd_d64_bias|fwd_ws_kernel|--dtype bf16 --batch 2 --seqlen 4096 --heads 32 --dim 64 --bias full"
  "fwd_vit|fwd_ws_kernel|--dtype bf16 --batch 64 --seqlen 197 --heads 12 --dim 64"
  "bwd_d128|bwd_kernel|--dtype bf16 --batch 4 --seqlen 4096 --heads 16 --dim 128 --backward"
  "bwd_d64|bwd_kernel|--dtype bf16 --batch 4 --seqlen 4096 --heads 32 --dim 64 --backward"
)
sections=(SpeedOfLight ComputeWorkloadAnalysis SchedulerStats WarpStateStats MemoryWorkloadAnalysis
          Occupancy LaunchStats)
# The lines worth reading in a terminal; the rest is in NAME.txt.
keep="Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issue Slots Busy|Issued Ipc|"
keep+="No Eligible|Eligible Warps|Warp Cycles Per Issued|Registers Per Thread|Shared Memory Config|"
keep+="Achieved Occupancy|Stall|L2 Hit|Executed Ipc"

if has profile; then
  for p in "${problems[@]}"; do
    IFS='|' read -r name kernel args <<<"$p"
    [[ $name =~ ${ONLY:-.} ]] || continue
    stamp "$name"
    sec=()
    for s in "${sections[@]}"; do sec+=(--section "$s"); done
    [ -n "$METRICS" ] && sec+=(--metrics "$METRICS")
    # shellcheck disable=SC2086  # args is a list of words
    # --clock-control none: the card's clocks as found (ncu would lock them to base otherwise).
    timeout 300 "$NCU" --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 \
      --launch-count 1 "${sec[@]}" \
      --print-details all -f -o "$OUT/$name" \
      "$ATTN_BIN" run --backend cuda --repeat 2 --no-check $args >"$OUT/$name.log" 2>&1
    echo "ncu rc $?"
    "$NCU" --import "$OUT/$name.ncu-rep" --print-details all >"$OUT/$name.txt" 2>&1
    grep -E "$keep|lts__t_sectors_op_red|sm__ops_path_tensor" "$OUT/$name.txt" | sed -E 's/ {2,}/  /g' | head -60
  done
fi
stamp end
