#!/usr/bin/env bash
# What ptxas makes of the OpenCL programs NVIDIA's driver compiled: for each
# file of an attn program cache (ATTN_CL_CACHE_DIR) whose binary is PTX, each
# kernel's registers, spill stores and loads, and static local (shared)
# memory, as `ptxas -v` reports them for ARCH (default sm_90). The driver
# keeps its own copy of the register allocation, but both come from the same
# PTX: the counts tell whether a kernel variant spilled or lost occupancy
# without a profiler (which NVIDIA's OpenCL does not reach). Run on the
# device machine after the programs of interest were built, e.g.
#
#   ATTN_CL_CACHE_DIR=/tmp/c build/tools/attn run --backend opencl ... --bias full
#   bash bench/cl_ptx_report.sh /tmp/c [sm_90]
#
# The cache file's header (cl/program.c: CACHE_HEADER) is 40 bytes.
set -u -o pipefail
dir=${1:?cache directory}
arch=${2:-sm_90}
ptxas=${PTXAS:-$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$dir"/*; do
  [ -f "$f" ] || continue
  # The driver's binary is the PTX text with its terminating NUL, which
  # ptxas reads as an unexpected end of file.
  tail -c +41 "$f" | tr -d '\000' >"$tmp/p.ptx"
  grep -q "^\.entry\|\.entry " "$tmp/p.ptx" 2>/dev/null || continue
  if ! "$ptxas" -arch="$arch" -v "$tmp/p.ptx" -o "$tmp/p.cubin" >"$tmp/v.log" 2>&1; then
    echo "$(basename "$f"): ptxas failed: $(head -1 "$tmp/v.log")"
    continue
  fi
  # ptxas -v: "Compiling entry function 'NAME'", then lines with the spills
  # and "Used N registers, ... M bytes smem" (no smem figure: none).
  awk -v file="$(basename "$f")" '
    /Compiling entry function/ { if (k != "") print file, k, r, ss, sl, sm; match($0, /'"'"'[^'"'"']*'"'"'/);
                                 k = substr($0, RSTART + 1, RLENGTH - 2); r = ss = sl = sm = "?" }
    /bytes spill stores/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "stores,") ss = $i;
                                                       if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "loads") sl = $i } }
    /Used [0-9]+ registers/ { sm = 0; for (i = 1; i <= NF; i++) { if ($i == "Used") r = $(i+1); if ($(i+1) == "bytes" && $(i+2) == "smem") sm = $i } }
    END { if (k != "") print file, k, r, ss, sl, sm }' "$tmp/v.log"
done | { printf '%-20s %-26s %5s %6s %6s %6s\n' file kernel regs spillS spillL smem; cat; } |
  awk 'NR == 1 || /: ptxas failed: / { print; next } { printf "%-20s %-26s %5s %6s %6s %6s\n", substr($1, 1, 20), $2, $3, $4, $5, $6 }'
