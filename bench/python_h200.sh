#!/usr/bin/env bash
# The Python package on the H200 machine, in one call: pip install . from
# this checkout with the wheels in $WHEELS (that machine reaches no package
# registry), into a venv that sees the machine's PyTorch and NumPy, then its
# pytest suite: CUDA (attn.torch against SDPA in bf16, on torch's stream),
# OpenCL and the CPU. Run from the project root:
#
#   WHEELS=.device/wheels bash bench/python_h200.sh [pytest arguments]
#
# $WHEELS holds scikit-build-core, nanobind and pytest with what they need
# (pure-Python wheels, any Python 3), and ninja for a machine without it;
# the machine's own CMake (3.24 or later) builds. CUDA_ARCH sets
# CMAKE_CUDA_ARCHITECTURES (default 90a-real: the H200's code alone, every
# kernel family, built fast). PIP_ARGS adds options to pip install (e.g.
# "-C cmake.define.ATTN_WITH_OPENCL=OFF"). Logs go under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${WHEELS:?set WHEELS to the folder of wheels (scikit-build-core, nanobind, pytest, ...)}"
WHEELS=$(cd "$WHEELS" && pwd)
OUT=${OUT:-/tmp/attn-out}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-/tmp/attn-python}
CUDA_ARCH=${CUDA_ARCH:-90a-real}
export PYTHONUNBUFFERED=1
export ATTN_CL_CACHE_DIR=${ATTN_CL_CACHE_DIR:-/tmp/attn-clcache}
# The CUDA backend is built when nvcc is found, as by .ci/setup.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

rm -rf "$VENV"
"$PYTHON" -m venv --system-site-packages "$VENV"
# When $PYTHON is itself a venv (the machine's PyTorch lives in one), a new
# venv's --system-site-packages reaches the base interpreter's packages, not
# that venv's: a .pth file adds its folders.
"$PYTHON" - "$VENV" <<'EOF'
import os, site, subprocess, sys
if sys.prefix != sys.base_prefix:
    python = os.path.join(sys.argv[1], "bin", "python")
    ask = "import sysconfig; print(sysconfig.get_path('purelib'))"
    target = subprocess.check_output([python, "-c", ask], text=True).strip()
    with open(os.path.join(target, "_parent_venv.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
EOF
py=$VENV/bin/python
$py -c 'import numpy; print("numpy", numpy.__version__)'
$py -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())' ||
  echo "torch is not visible: the attn.torch tests will skip"

# --no-deps: NumPy, the one dependency, is the machine's own (above); the
# build's needs come from $WHEELS into pip's isolated build environment.
t0=$(date +%s)
log=$OUT/python_install.log
# shellcheck disable=SC2086
if ! $py -m pip install -v --no-index --find-links "$WHEELS" --no-deps \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" ${PIP_ARGS:-} . >"$log" 2>&1; then
  tail -40 "$log"
  echo "pip install failed: $log"
  exit 1
fi
echo "pip install: $(( $(date +%s) - t0 )) s"
grep -E "The CUDA compiler|OpenCL" "$log" | head -5 || true
$py -c 'import attn, json; print(json.dumps(attn.info(), indent=1))' | tee "$OUT/python_info.json"
$py -m pytest python/tests -q -rs "$@" 2>&1 | tee "$OUT/python_pytest.log"
