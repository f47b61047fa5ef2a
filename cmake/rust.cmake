# The Rust binding (issue 21, bindings/rust): fp8amp-sys (raw declarations checked against the
# header) and fp8amp (the safe crate). Standard library only, built offline with the committed
# Cargo.lock. Included at the end of the top-level CMakeLists.txt.
#   rust.cargo_test    cargo test: both crates against the libfp8amp just built
#   conformance.rust   the conformance scenario's Rust runner (tests/conformance/SCENARIO.md),
#                      writing ${PROJECT_BINARY_DIR}/tests/conformance/out/rust.bin
option(FP8AMP_BINDINGS_RUST "Test the Rust binding (bindings/rust) with cargo, offline" OFF)
set(FP8AMP_RUST_JOBS 2 CACHE STRING "cargo -j for the Rust binding's tests")

if(FP8AMP_BINDINGS_RUST)
  # rustup installs into ~/.cargo/bin, which is often not on PATH for non-login shells
  find_program(FP8AMP_CARGO cargo HINTS "$ENV{CARGO_HOME}/bin" "$ENV{HOME}/.cargo/bin")
  if(NOT FP8AMP_CARGO)
    message(FATAL_ERROR "FP8AMP_BINDINGS_RUST=ON but cargo was not found: install Rust "
                        "(Debian/Ubuntu: apt-get install cargo rustc, or bash tests/install_deps.sh rust; "
                        "Rust >= 1.63) or set FP8AMP_CARGO to the cargo program")
  endif()
  if(FP8AMP_BUILD_TESTS)
    # cargo's target folder lives in the build tree; the library comes from the build too
    # (FP8AMP_LIB_DIR, read by fp8amp-sys's build.rs, which also sets the test binaries' rpath).
    set(fp8amp_rust_env
        FP8AMP_LIB_DIR=$<TARGET_FILE_DIR:fp8amp>
        CARGO_TARGET_DIR=${PROJECT_BINARY_DIR}/rust-target
        CC=${CMAKE_C_COMPILER})
    # The runner writes beside the other bindings' files; conformance.compare (tests/conformance)
    # requires rust.bin when FP8AMP_BINDINGS_RUST is on, and runs after this test (the fixture).
    set(fp8amp_rust_bin ${PROJECT_BINARY_DIR}/tests/conformance/out/rust.bin)
    file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/tests/conformance/out)
    add_test(NAME rust.cargo_test
             COMMAND ${CMAKE_COMMAND} -E env ${fp8amp_rust_env}
                     ${FP8AMP_CARGO} test --offline --locked -j ${FP8AMP_RUST_JOBS}
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/bindings/rust)
    add_test(NAME conformance.rust
             COMMAND sh -c "rm -f \"$1\" && shift && exec \"$@\"" sh ${fp8amp_rust_bin}
                     ${CMAKE_COMMAND} -E env ${fp8amp_rust_env}
                     ${FP8AMP_CARGO} run --offline --locked -q -j ${FP8AMP_RUST_JOBS} -p fp8amp
                     --example conformance -- ${fp8amp_rust_bin}
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/bindings/rust)
    # the first run compiles both crates; both tests share cargo's target folder
    set_tests_properties(rust.cargo_test conformance.rust PROPERTIES
                         TIMEOUT 900 RESOURCE_LOCK fp8amp_rust_target LABELS rust)
    set_tests_properties(conformance.rust PROPERTIES FIXTURES_SETUP conformance)
  endif()
endif()
