//! Finds libfp8amp and tells rustc to link it.
//!
//! In this order:
//! 1. `FP8AMP_LIB_DIR`: the folder that holds `libfp8amp.so` (a build tree or `<prefix>/lib`);
//! 2. pkg-config's `fp8amp` (set `PKG_CONFIG_PATH=<prefix>/lib/pkgconfig` for an install);
//! 3. the linker's default search path (a system-wide install).
//!
//! The folder found is handed to dependent crates as `DEP_FP8AMP_LIB_DIR` (the `links` key), which
//! the safe crate's build script turns into an rpath for its tests and examples, and used as the
//! rpath of this crate's own tests, so that `cargo test` runs without `LD_LIBRARY_PATH`.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn pkg_config_lib_dirs() -> Vec<String> {
    let out = match Command::new(env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into()))
        .args(["--libs-only-L", "fp8amp"])
        .output()
    {
        Ok(o) if o.status.success() => o,
        _ => return Vec::new(),
    };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|f| f.strip_prefix("-L"))
        // a relocatable .pc gives <prefix>/lib/pkgconfig/../../lib: make the rpath plain
        .map(|d| std::fs::canonicalize(d).map_or_else(|_| d.to_owned(), |p| p.to_string_lossy().into_owned()))
        .collect()
}

fn main() {
    println!("cargo:rerun-if-env-changed=FP8AMP_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");

    let dirs: Vec<String> = match env::var("FP8AMP_LIB_DIR") {
        Ok(d) if !d.is_empty() => {
            let p = PathBuf::from(&d);
            if !p.is_dir() {
                panic!("FP8AMP_LIB_DIR={} is not a directory (it must hold libfp8amp.so)", d);
            }
            vec![p.canonicalize().unwrap().to_string_lossy().into_owned()]
        }
        _ => pkg_config_lib_dirs(),
    };
    for d in &dirs {
        println!("cargo:rustc-link-search=native={}", d);
        // For this crate's tests; dependents get it through DEP_FP8AMP_LIB_DIR.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", d);
    }
    if dirs.is_empty() {
        println!(
            "cargo:warning=fp8amp-sys: neither FP8AMP_LIB_DIR nor pkg-config's fp8amp names a folder; \
             linking libfp8amp from the linker's default paths"
        );
    }
    if let Some(d) = dirs.first() {
        println!("cargo:lib_dir={}", d);
    }
    println!("cargo:rustc-link-lib=dylib=fp8amp");
}
