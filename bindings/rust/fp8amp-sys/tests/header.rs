//! Checks the hand-written declarations of `src/lib.rs` against the C header, so that a header
//! change this crate does not follow fails `cargo test`:
//!
//! - every `FP8AMP_API` function of the header is declared here and nothing else is, with the
//!   same parameter and return types (C types mapped to Rust by this test's own table);
//! - every struct has the same fields in the same order with the same types, and the same `sizeof`
//!   and `offsetof` of every field as the C compiler gives (a small C program, compiled with `$CC`
//!   or `cc`, prints them);
//! - every enum's constants and every integer `#define` have the header's values, enum types are
//!   `c_uint` (what gcc and clang make of an enum of non-negative values), and the handle and
//!   function-pointer typedefs match.
//!
//! The header is `FP8AMP_HEADER` if set, else `capi/include/fp8amp/fp8amp.h` of this repository.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn header_path() -> PathBuf {
    match std::env::var_os("FP8AMP_HEADER") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../capi/include/fp8amp/fp8amp.h"),
    }
}

fn strip_c_comments(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            let end = s[i + 2..].find("*/").expect("unterminated comment") + i + 4;
            out.push(' ');
            i = end;
        } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// This test's own C -> Rust type table (bindgen's conventions).
fn c_to_rust(ty: &str) -> String {
    let spaced = ty.replace('*', " * ");
    let toks: Vec<&str> = spaced.split_whitespace().collect();
    let stars = toks.iter().filter(|t| **t == "*").count();
    let is_const = toks.first() == Some(&"const");
    let base: Vec<&str> = toks.iter().copied().filter(|t| *t != "*" && *t != "const").collect();
    let base = base.join(" ");
    let r = match base.as_str() {
        "void" => "c_void",
        "char" => "c_char",
        "uint32_t" => "u32",
        "int32_t" => "i32",
        "int64_t" => "i64",
        "uint64_t" => "u64",
        "size_t" => "usize",
        "float" => "f32",
        "double" => "f64",
        "struct DLManagedTensorVersioned" => "DLManagedTensorVersioned",
        other => {
            assert!(other.starts_with("fp8amp_"), "header type {:?}: extend this test's table", ty);
            other
        }
    }
    .to_string();
    if stars == 0 {
        return r;
    }
    let mut out = format!("{} {}", if is_const { "*const" } else { "*mut" }, r);
    for _ in 1..stars {
        out = format!("*mut {}", out);
    }
    out
}

/// "const int64_t *shape" -> ("shape", "const int64_t *"); "char internal[128]" -> (.., "char[128]").
fn split_decl(decl: &str) -> (String, String) {
    let decl = squash(decl);
    let (decl, array) = match decl.find('[') {
        Some(i) => (decl[..i].trim().to_string(), Some(decl[i + 1..decl.len() - 1].trim().to_string())),
        None => (decl.clone(), None),
    };
    let name_start = decl.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
    let name = decl[name_start..].to_string();
    let ty = decl[..name_start].trim().to_string();
    let rust = c_to_rust(&ty);
    let rust = match array {
        Some(n) => format!("[{}; {}]", rust, n),
        None => rust,
    };
    (if name == "type" { "type_".into() } else { name }, rust)
}

fn split_params(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// A signature: (parameter types, return type) in Rust spelling; parameter names are not compared.
type Sig = (Vec<String>, String);

#[derive(Default, Debug)]
struct Api {
    functions: BTreeMap<String, Sig>,
    structs: BTreeMap<String, Vec<(String, String)>>,
    consts: BTreeMap<String, i64>,
    enums: Vec<String>,
    handles: BTreeMap<String, String>,
    fn_ptrs: BTreeMap<String, Sig>,
}

fn c_params(p: &str) -> Vec<String> {
    let p = squash(p);
    if p == "void" || p.is_empty() {
        return Vec::new();
    }
    split_params(&p).iter().map(|d| split_decl(d).1).collect()
}

fn parse_header(text: &str) -> Api {
    let mut api = Api::default();
    // comments out, macro continuation lines joined (so that a #define is one line)
    let src = strip_c_comments(text).replace("\\\n", " ");
    // #defines with an integer value (function-like macros and the include guard are skipped).
    for line in src.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("#define ") {
            let mut it = rest.splitn(2, char::is_whitespace);
            let name = it.next().unwrap();
            let val = it.next().unwrap_or("").trim().trim_start_matches('(').trim_end_matches(')');
            if name.contains('(') {
                continue;
            }
            if let Ok(v) = val.parse::<i64>() {
                api.consts.insert(name.to_string(), v);
            }
        }
    }
    let body: String = src.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
    for stmt in body.split(';') {
        let s = squash(stmt);
        let s = s.trim_start_matches("} /* extern \"C\" */").trim().to_string();
        let s = s.strip_prefix("extern \"C\" {").map(|x| x.trim().to_string()).unwrap_or(s);
        let s = s.trim_start_matches('}').trim().to_string();
        if let Some(decl) = s.strip_prefix("FP8AMP_API ") {
            // RET NAME(PARAMS) or RET (NAME)(PARAMS)
            let open = decl.rfind('(').unwrap();
            // the parameter list is the last top-level (...) group
            let params_start = {
                let mut depth = 0;
                let mut start = open;
                for (i, c) in decl.char_indices().rev() {
                    if c == ')' {
                        depth += 1;
                    } else if c == '(' {
                        depth -= 1;
                        if depth == 0 {
                            start = i;
                            break;
                        }
                    }
                }
                start
            };
            let params = &decl[params_start + 1..decl.len() - 1];
            let head = decl[..params_start].trim().trim_end_matches(')').trim();
            let name_start = head.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
            let name = head[name_start..].to_string();
            let ret = head[..name_start].trim().trim_end_matches('(').trim();
            let ret = if ret == "void" { "()".to_string() } else { c_to_rust(ret) };
            api.functions.insert(name, (c_params(params), ret));
        } else if let Some(rest) = s.strip_prefix("typedef struct ") {
            // structs with a body are read below, whole; here: `typedef struct x_s *x`
            if !rest.contains('{') {
                let (target, name) = rest.split_once('*').expect("typedef struct x_s *x");
                api.handles.insert(name.trim().to_string(), target.trim().to_string());
            }
        } else if let Some(rest) = s.strip_prefix("typedef enum ") {
            let brace = rest.find('{').unwrap();
            let name = rest[..brace].trim().to_string();
            let close = rest.rfind('}').unwrap();
            for item in rest[brace + 1..close].split(',') {
                let mut kv = item.splitn(2, '=');
                let k = kv.next().unwrap().trim();
                if k.is_empty() {
                    continue;
                }
                let v: i64 = kv.next().expect("enum constants have explicit values").trim().parse().unwrap();
                api.consts.insert(k.to_string(), v);
            }
            api.enums.push(name);
        } else if let Some(rest) = s.strip_prefix("typedef ") {
            if let Some(star) = rest.find("(*") {
                let ret = rest[..star].trim();
                let name_end = rest[star..].find(')').unwrap() + star;
                let name = rest[star + 2..name_end].trim().to_string();
                let params = &rest[name_end + 2..rest.len() - 1];
                let ret = if ret == "void" { "()".to_string() } else { c_to_rust(ret) };
                api.fn_ptrs.insert(name, (c_params(params), ret));
            }
        }
    }
    // Struct fields, parsed from the comment-free text block by block.
    let mut rest = body.as_str();
    while let Some(i) = rest.find("typedef struct ") {
        rest = &rest[i + "typedef struct ".len()..];
        let semi = rest.find(';').unwrap();
        let brace = match rest.find('{') {
            Some(b) if b < semi => b,
            _ => continue,
        };
        let name = rest[..brace].trim().to_string();
        let close = rest.find('}').unwrap();
        let fields: Vec<(String, String)> =
            rest[brace + 1..close].split(';').map(str::trim).filter(|f| !f.is_empty()).map(split_decl).collect();
        api.structs.insert(name, fields);
        rest = &rest[close..];
    }
    api
}

fn strip_rust_comments(s: &str) -> String {
    s.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn rust_sig(params: &str, ret: Option<&str>) -> Sig {
    let ps = split_params(&squash(params)).iter().map(|p| squash(p.split_once(':').unwrap().1)).collect();
    (ps, ret.map_or("()".to_string(), squash))
}

fn parse_sys(text: &str) -> Api {
    let mut api = Api::default();
    let src = strip_rust_comments(text);
    let ext = src.find("extern \"C\" {").expect("an extern block");
    let ext_body = &src[ext + "extern \"C\" {".len()..src[ext..].rfind('}').unwrap() + ext];
    for item in ext_body.split(';') {
        let item = squash(item);
        if item.is_empty() {
            continue;
        }
        let decl = item.strip_prefix("pub fn ").unwrap_or_else(|| panic!("unexpected item in extern block: {}", item));
        let open = decl.find('(').unwrap();
        let close = decl.rfind(')').unwrap();
        let ret = decl[close + 1..].trim().strip_prefix("->").map(str::trim);
        api.functions.insert(decl[..open].to_string(), rust_sig(&decl[open + 1..close], ret));
    }
    let outside = &src[..ext];
    for stmt in outside.split(';') {
        let s = squash(stmt);
        // statements may start after a closing brace of an earlier item
        let s = match s.rfind("pub const ").or_else(|| s.rfind("pub type ")) {
            Some(i) => s[i..].to_string(),
            None => continue,
        };
        if let Some(c) = s.strip_prefix("pub const ") {
            let name = c[..c.find(':').unwrap()].trim().to_string();
            let val = c[c.find('=').unwrap() + 1..].trim().parse::<i64>().unwrap();
            api.consts.insert(name, val);
        } else if let Some(t) = s.strip_prefix("pub type ") {
            let name = t[..t.find('=').unwrap()].trim().to_string();
            let val = t[t.find('=').unwrap() + 1..].trim().to_string();
            if val == "c_uint" {
                api.enums.push(name);
            } else if let Some(f) = val
                .strip_prefix("Option< unsafe extern \"C\" fn(")
                .or_else(|| val.strip_prefix("Option<unsafe extern \"C\" fn("))
            {
                let close = f.rfind(')').unwrap();
                let tail = f[close + 1..].trim().trim_end_matches('>').trim().trim_end_matches(',').trim();
                api.fn_ptrs.insert(name, rust_sig(&f[..close], tail.strip_prefix("->").map(str::trim)));
            }
        }
    }
    // the handles, made by the opaque! macro: "x_s => x,"
    let op = outside.find("opaque!(").expect("the opaque! list");
    for pair in outside[op + 8..op + outside[op..].find(");").unwrap()].split(',') {
        if let Some((s, h)) = pair.split_once("=>") {
            api.handles.insert(h.trim().to_string(), s.trim().to_string());
        }
    }
    // #[repr(C)] structs with pub fields
    let mut rest = outside;
    while let Some(i) = rest.find("pub struct ") {
        rest = &rest[i + "pub struct ".len()..];
        let brace = rest.find('{').unwrap();
        let name = rest[..brace].trim().to_string();
        let close = rest.find('}').unwrap();
        let body = &rest[brace + 1..close];
        if !body.contains("_private") {
            let fields = split_params(&squash(body))
                .iter()
                .map(|f| {
                    let f = f.strip_prefix("pub ").unwrap();
                    let (n, t) = f.split_once(':').unwrap();
                    (n.trim().to_string(), squash(t))
                })
                .collect();
            api.structs.insert(name, fields);
        }
        rest = &rest[close..];
    }
    api
}

fn apis() -> (Api, Api) {
    let h = header_path();
    let header =
        std::fs::read_to_string(&h).unwrap_or_else(|e| panic!("cannot read the header {}: {}", h.display(), e));
    let sys = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    (parse_header(&header), parse_sys(&sys))
}

#[test]
fn functions_match_the_header() {
    let (c, r) = apis();
    assert!(c.functions.len() >= 100, "the header parser found only {} functions", c.functions.len());
    let missing: Vec<_> = c.functions.keys().filter(|k| !r.functions.contains_key(*k)).collect();
    let extra: Vec<_> = r.functions.keys().filter(|k| !c.functions.contains_key(*k)).collect();
    assert!(missing.is_empty(), "declared in the header, missing from fp8amp-sys: {:?}", missing);
    assert!(extra.is_empty(), "declared in fp8amp-sys, not in the header: {:?}", extra);
    for (name, sig) in &c.functions {
        assert_eq!(&r.functions[name], sig, "{}: (parameter types, return type) differ from the header's", name);
    }
}

#[test]
fn structs_enums_constants_and_typedefs_match_the_header() {
    let (c, r) = apis();
    assert_eq!(c.structs.keys().collect::<Vec<_>>(), r.structs.keys().collect::<Vec<_>>(), "struct names");
    for (name, fields) in &c.structs {
        assert!(!fields.is_empty(), "{}: no fields parsed", name);
        assert_eq!(&r.structs[name], fields, "{}: fields (name, type) differ from the header's", name);
    }
    assert_eq!(c.consts, r.consts, "enum constants and integer #defines");
    let mut ce = c.enums.clone();
    let mut re = r.enums.clone();
    ce.sort();
    re.sort();
    assert_eq!(ce, re, "enum types (each `pub type X = c_uint`)");
    assert_eq!(c.handles, r.handles, "opaque handle typedefs");
    assert_eq!(c.fn_ptrs, r.fn_ptrs, "function pointer typedefs");
}

/// (struct, field or "" for sizeof, value) from Rust.
macro_rules! rust_layouts {
    ($($s:ident { $($f:ident),* })*) => {{
        let mut v: Vec<(String, String, usize)> = Vec::new();
        $(
            v.push((stringify!($s).into(), String::new(), std::mem::size_of::<fp8amp_sys::$s>()));
            $({
                let u = std::mem::MaybeUninit::<fp8amp_sys::$s>::uninit();
                let base = u.as_ptr();
                // SAFETY: addr_of! computes a field address without reading the uninit memory.
                let off = unsafe { std::ptr::addr_of!((*base).$f) as usize - base as usize };
                v.push((stringify!($s).into(), stringify!($f).into(), off));
            })*
        )*
        v
    }};
}

#[test]
fn struct_layouts_match_the_c_compiler() {
    let (c, _) = apis();
    let rust = rust_layouts!(
        fp8amp_device { type_, index }
        fp8amp_recipe { struct_size, format, mode, margin, interval, amax_history_len, amax_algo, power_of_two_scales }
        fp8amp_scaling_stats { quantized, saturated, underflowed }
        fp8amp_linear_desc { struct_size, in_features, out_features, has_bias, weight_dtype, wgrad_dtype, recipe, policy, graph_replay }
        fp8amp_adam_desc { struct_size, adamw, lr, beta1, beta2, eps, weight_decay, maximize, exp_avg_dtype, exp_avg_sq_dtype, master_dtype, state_block_size, max_grad_norm, master_rounding, rounding_seed }
        fp8amp_param_desc { struct_size, master_dtype, master_init }
        fp8amp_param_state { struct_size, has_master, step, exp_avg, exp_avg_scale_inv, exp_avg_sq, exp_avg_sq_scale_inv, master, master_scale_inv, param_meta_history, param_meta_scale, param_meta_amax, param_meta_updates }
        fp8amp_adam_step_args { struct_size, lr, lr_device, grad_scale_inv, scaler }
        fp8amp_grad_scaler_desc { struct_size, init_scale, growth_factor, backoff_factor, growth_interval, hysteresis }
        fp8amp_grad_scaler_state { scale, growth_tracker, hysteresis_left }
        fp8amp_comm_unique_id { internal }
        fp8amp_comm_reduce_desc { struct_size, wire_dtype, average, check }
        fp8amp_norm_desc { struct_size, kind, eps, zero_centered_gamma }
    );
    // This list must name every struct and field of the header (so it cannot go stale).
    let listed: Vec<(String, String)> =
        rust.iter().filter(|e| !e.1.is_empty()).map(|e| (e.0.clone(), e.1.clone())).collect();
    let header: Vec<(String, String)> =
        c.structs.iter().flat_map(|(s, fs)| fs.iter().map(move |f| (s.clone(), f.0.clone()))).collect();
    let mut a = listed.clone();
    let mut b = header.clone();
    a.sort();
    b.sort();
    assert_eq!(a, b, "this test's layout list vs the header's structs and fields");

    // The C side: a program printing sizeof and offsetof of the same names.
    let dir = std::env::temp_dir().join(format!("fp8amp_sys_layout_{}", std::process::id()));
    std::fs::create_dir_all(dir.join("fp8amp")).unwrap();
    // A stand-in version.h (the layout does not depend on it; fp8amp.h includes the real one beside it).
    std::fs::write(dir.join("fp8amp/version.h"), "#define FP8AMP_VERSION 0\n").unwrap();
    let mut prog =
        String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"fp8amp/fp8amp.h\"\nint main(void) {\n");
    for (s, f, _) in &rust {
        if f.is_empty() {
            prog += &format!("  printf(\"{s} - %zu\\n\", sizeof({s}));\n", s = s);
        } else {
            let cf = if f == "type_" { "type" } else { f.as_str() };
            prog += &format!("  printf(\"{s} {f} %zu\\n\", offsetof({s}, {cf}));\n", s = s, f = f, cf = cf);
        }
    }
    prog += "  return 0;\n}\n";
    std::fs::write(dir.join("layout.c"), prog).unwrap();
    let include = header_path().parent().unwrap().parent().unwrap().to_path_buf();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let exe = dir.join("layout");
    let out = Command::new(&cc)
        .arg("-std=c99")
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(&dir)
        .arg(dir.join("layout.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {:?} (set CC): {}", cc, e));
    assert!(out.status.success(), "compiling the layout program failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let text = String::from_utf8(run.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), rust.len());
    for ((s, f, v), line) in rust.iter().zip(lines) {
        let parts: Vec<&str> = line.split(' ').collect();
        let cv: usize = parts[2].parse().unwrap();
        assert_eq!(*v, cv, "{}.{}: Rust {} vs C {} ({})", s, if f.is_empty() { "sizeof" } else { f }, v, cv, line);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The enum types really are unsigned 32-bit to the C compiler is covered by the layouts (a field
/// of an enum type would move otherwise); a live call proves the linking.
#[test]
fn links_and_calls_the_library() {
    let v = unsafe { fp8amp_sys::fp8amp_version() };
    assert!(v >= 300, "fp8amp_version() = {}", v);
    let name =
        unsafe { std::ffi::CStr::from_ptr(fp8amp_sys::fp8amp_status_name(fp8amp_sys::FP8AMP_ERROR_SHAPE_MISMATCH)) };
    assert_eq!(name.to_str().unwrap(), "FP8AMP_ERROR_SHAPE_MISMATCH");
}
