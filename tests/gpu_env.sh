# Sourced by the scripts that build and test on a GPU machine (tests/run_on_gpu.sh,
# bench/adam_device_run.sh): the environment they share. Sets prefix_args (CMake arguments) and
# exports LD_LIBRARY_PATH / PYTHONPATH as needed.
# CMOCKA_PREFIX: where CMocka's include/ and lib/ are, if not installed system-wide.
# WHEELS: a folder of wheels to install first (bindings/python/fetch_wheels.sh: cffi for the Python
# binding's tests, on a machine without a package index).
prefix_args=()
if [ -n "${CMOCKA_PREFIX:-}" ]; then
  prefix_args=(-DCMAKE_PREFIX_PATH="$CMOCKA_PREFIX" -DCMAKE_LIBRARY_PATH="$CMOCKA_PREFIX/lib/x86_64-linux-gnu")
  export LD_LIBRARY_PATH="$CMOCKA_PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$WHEELS"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
