//! Gives this crate's tests and examples an rpath to the libfp8amp that fp8amp-sys linked
//! (`DEP_FP8AMP_LIB_DIR`, from its `links = "fp8amp"`), so they run without `LD_LIBRARY_PATH`.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_FP8AMP_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_FP8AMP_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
