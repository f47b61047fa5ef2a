"""Imports the ``fp8amp`` package built against a given libfp8amp, for scripts outside the package
that are handed a library path (the benchmarks' ``--lib``, tests/reference's ``<lib>``): they call
the C API through the binding's CFFI module (its structs and constants come from the public headers),
never through hand-written ctypes mirrors of them.

    sys.path.insert(0, "<repo>/bindings/python")
    from binding_for import import_fp8amp
    fp8amp = import_fp8amp("build/libfp8amp.so")     # fp8amp._lib, fp8amp._ffi: the raw CFFI module

The package is built once per library folder (pip, as bindings/python/run_tests.sh does) into
``<library folder>/python-binding`` and rebuilt when the headers or the binding's sources change
(a hash of them is kept beside it). The headers: this source tree's capi/include plus the build
folder's generated include/ (fp8amp/version.h) when the library sits in a build folder, else the
install prefix's include/. Needs cffi, setuptools, wheel and Python's headers
(``MissingBuildTools`` otherwise).
"""
import fcntl
import glob
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


class MissingBuildTools(RuntimeError):
    """The Python tools the binding's build needs are not installed."""


def _include_dirs(libdir):
    if os.path.exists(os.path.join(libdir, "include", "fp8amp", "version.h")):  # a CMake build folder
        return [os.path.join(REPO, "capi", "include"), os.path.join(libdir, "include")]
    prefix_inc = os.path.normpath(os.path.join(libdir, "..", "include"))
    if os.path.exists(os.path.join(prefix_inc, "fp8amp", "version.h")):  # an install prefix
        return [prefix_inc]
    raise RuntimeError("no fp8amp/version.h in %s/include (a build folder) or %s (an install prefix)"
                       % (libdir, prefix_inc))


def _digest(incs):
    h = hashlib.sha256()
    files = [os.path.join(d, "fp8amp", n) for d in incs for n in ("fp8amp.h", "version.h", "dlpack.h")]
    files += [os.path.join(HERE, n) for n in ("build_ffi.py", "setup.py", "pyproject.toml")]
    files += sorted(glob.glob(os.path.join(HERE, "src", "fp8amp", "**", "*.py"), recursive=True))
    for f in files:
        if os.path.exists(f):
            h.update(f.encode())
            with open(f, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def import_fp8amp(lib_path):
    """The fp8amp package built against the library at lib_path (imported; sys.path gains its site)."""
    lib_path = os.path.realpath(lib_path)
    libdir = os.path.dirname(lib_path)
    if "fp8amp" in sys.modules:
        raise RuntimeError("fp8amp is already imported in this process: import_fp8amp must come first")
    try:
        import cffi  # noqa: F401
        import setuptools  # noqa: F401
        import sysconfig
        import wheel  # noqa: F401
        if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
            raise ImportError("Python.h")
    except ImportError as e:
        raise MissingBuildTools("building the fp8amp binding needs cffi, setuptools, wheel and Python's "
                                "headers (%s is missing)" % e) from e
    incs = _include_dirs(libdir)
    root = os.path.join(libdir, "python-binding")
    os.makedirs(root, exist_ok=True)
    site, stamp = os.path.join(root, "site"), os.path.join(root, "stamp")
    digest = _digest(incs)
    with open(os.path.join(root, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # scripts run side by side share one build
        if not (os.path.exists(stamp) and open(stamp).read() == digest):
            subprocess.run(["rm", "-rf", site, stamp], check=True)
            env = dict(os.environ, FP8AMP_INCLUDE_DIR=os.pathsep.join(incs), FP8AMP_LIB_DIR=libdir)
            env.pop("LD_PRELOAD", None)  # a sanitizer runtime is for the checked process, not for pip
            with tempfile.TemporaryDirectory() as tmp:  # built from a copy: no build/ in the source tree
                pkg = os.path.join(tmp, "pkg")
                shutil.copytree(HERE, pkg, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                                         "_fp8amp_cffi*"))
                r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                                    "--target", site, pkg], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError("building the fp8amp binding failed:\n" + r.stdout + r.stderr)
            with open(stamp, "w") as f:
                f.write(digest)
    sys.path.insert(0, site)
    fp8amp = importlib.import_module("fp8amp")
    with open("/proc/self/maps") as f:  # the module's rpath must have found this very library
        loaded = {line.split()[-1] for line in f if "libfp8amp.so" in line}
    if loaded and not any(os.path.realpath(p) == lib_path for p in loaded):
        raise RuntimeError("the fp8amp binding loaded %s, not %s" % (", ".join(sorted(loaded)), lib_path))
    return fp8amp
