//! The safe crate on a CPU context: RAII, error mapping, quantize against an independent E4M3
//! reference, the Linear against a float64 matmul, an O2 optimizer step against float64 Adam, and
//! the threading contract. Fresh random data each run (never zeros; the seed is printed).
mod common;

use common::{e4m3_decode, e4m3_encode, Rng};
use fp8amp::{
    sys, AdamDesc, Context, Dtype, GemmKind, GemmPolicy, Linear, LinearDesc, OptLevel, Optimizer, ParamStateIn, Recipe,
    Role, Scaling, Status, StepArgs, Tensor,
};

fn linear_desc(k: i64, n: i64) -> LinearDesc {
    let mut d = LinearDesc::new(k, n).unwrap();
    d.weight_dtype = Dtype::F32;
    d.recipe = Recipe::current();
    d.policy = GemmPolicy::AlwaysFp8;
    d
}

// ---- RAII ---------------------------------------------------------------------------------------

#[test]
fn drop_destroys_each_handle_once() {
    let ctx = Context::cpu().unwrap();
    let t = Tensor::new(&ctx, Dtype::F32, &[3, 5]).unwrap();
    let raw = t.as_raw();
    let mut d = 0;
    assert_eq!(unsafe { sys::fp8amp_tensor_dtype(raw, &mut d) }, sys::FP8AMP_SUCCESS);
    drop(t);
    // dropped: the C handle is gone
    assert_eq!(unsafe { sys::fp8amp_tensor_dtype(raw, &mut d) }, sys::FP8AMP_ERROR_INVALID_HANDLE);

    // into_raw gives the handle up without destroying it; from_raw takes it back and drop destroys
    // it once: a second C destroy of the same handle is INVALID_HANDLE.
    let t = Tensor::new(&ctx, Dtype::E4M3, &[7]).unwrap();
    let raw = t.into_raw();
    assert_eq!(unsafe { sys::fp8amp_tensor_dtype(raw, &mut d) }, sys::FP8AMP_SUCCESS);
    drop(unsafe { Tensor::from_raw(raw) });
    assert_eq!(unsafe { sys::fp8amp_tensor_destroy(raw) }, sys::FP8AMP_ERROR_INVALID_HANDLE);

    // the other kinds
    let meta = Scaling::new(&ctx, &Recipe::default(), Dtype::E4M3).unwrap();
    let meta_raw = meta.as_raw();
    let lin = Linear::new(&ctx, &linear_desc(16, 8)).unwrap();
    let lin_raw = lin.as_raw();
    let w = lin.weight().unwrap();
    let opt = Optimizer::new(&ctx, &AdamDesc::new().unwrap()).unwrap();
    let opt_raw = opt.as_raw();
    drop(meta);
    drop(lin);
    drop(opt);
    let (mut s, mut si, mut a) = (0f32, 0f32, 0f32);
    assert_eq!(unsafe { sys::fp8amp_scaling_get(meta_raw, &mut s, &mut si, &mut a) }, sys::FP8AMP_ERROR_INVALID_HANDLE);
    let mut kind = 0;
    assert_eq!(unsafe { sys::fp8amp_linear_gemm_kind(lin_raw, &mut kind) }, sys::FP8AMP_ERROR_INVALID_HANDLE);
    let mut n = 0;
    assert_eq!(unsafe { sys::fp8amp_optimizer_num_params(opt_raw, &mut n) }, sys::FP8AMP_ERROR_INVALID_HANDLE);
    // a tensor handle obtained from the Linear outlives it (C: it shares the object)
    assert_eq!(w.shape().unwrap(), vec![8, 16]);
    drop(w);

    let ctx_raw = ctx.as_raw();
    drop(ctx);
    let mut dev = sys::fp8amp_device { type_: 0, index: 0 };
    assert_eq!(unsafe { sys::fp8amp_context_device(ctx_raw, &mut dev) }, sys::FP8AMP_ERROR_INVALID_HANDLE);
}

// ---- errors -------------------------------------------------------------------------------------

#[test]
fn errors_carry_the_status_and_the_librarys_message() {
    let mut rng = Rng::new("errors");
    let ctx = Context::cpu().unwrap();
    let lin = Linear::new(&ctx, &linear_desc(32, 16)).unwrap();
    lin.weight().unwrap().copy_from_host(&rng.spread(16 * 32, -3, 0)).unwrap();
    lin.bias().unwrap().copy_from_host(&rng.spread(16, -3, 0)).unwrap();

    // x's last dimension is not in_features
    let x = Tensor::from_f32(&ctx, &[4, 31], &rng.spread(4 * 31, -2, 2)).unwrap();
    let y = Tensor::new(&ctx, Dtype::F32, &[4, 16]).unwrap();
    let before = rng.spread(4 * 16, -1, 1);
    y.copy_from_host(&before).unwrap();
    let e = lin.forward(&x, &y, true).unwrap_err();
    assert_eq!(e.status, Status::ShapeMismatch, "{}", e);
    assert!(e.message.starts_with("fp8amp_linear_forward"), "message: {}", e.message);
    assert!(e.message.contains("31") && e.message.contains("32"), "the message names the sizes: {}", e.message);
    assert_eq!(e.to_string(), format!("FP8AMP_ERROR_SHAPE_MISMATCH: {}", e.message));
    // a failed call changes nothing
    assert_eq!(y.to_vec::<f32>().unwrap(), before);
    let _: &dyn std::error::Error = &e;

    // a host slice of the wrong length: the library's own check
    let t = Tensor::new(&ctx, Dtype::F32, &[2, 3]).unwrap();
    let e = t.copy_from_host(&[1.5f32; 5]).unwrap_err();
    assert_eq!(e.status, Status::ShapeMismatch);
    assert!(e.message.starts_with("fp8amp_tensor_copy_from_host"), "{}", e.message);
    // a slice type that does not fit the dtype: refused before the call, same vocabulary
    let e = t.copy_from_host(&[1u16; 6]).unwrap_err();
    assert_eq!(e.status, Status::DtypeMismatch);
    assert!(e.message.contains("F32"), "{}", e.message);
    // an extent < 1
    let e = Tensor::new(&ctx, Dtype::F32, &[2, 0]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.starts_with("fp8amp_tensor_create"), "{}", e.message);
    // the lean level: 0 by default, 0-2 taken, anything else refused and the level kept
    assert_eq!(lin.lean().unwrap(), 0);
    lin.set_lean(2).unwrap();
    assert_eq!(lin.lean().unwrap(), 2);
    let e = lin.set_lean(3).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{}", e);
    assert!(e.message.starts_with("fp8amp_linear_set_lean"), "{}", e.message);
    assert_eq!(lin.lean().unwrap(), 2);
    lin.set_lean(0).unwrap();
    // backward before any training forward
    let dy = Tensor::from_f32(&ctx, &[4, 16], &rng.spread(64, -1, 1)).unwrap();
    let e = lin.backward(&dy, None, false).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{}", e);
    // CUDA in this build or on this machine: NOT_SUPPORTED with the reason (or a context when a
    // GPU is there)
    match Context::new(fp8amp::Device::cuda(0)) {
        Ok(c) => assert_eq!(c.device().unwrap(), fp8amp::Device::cuda(0)),
        Err(e) => assert!(matches!(e.status, Status::NotSupported | Status::DeviceMismatch), "{}", e),
    }
}

// ---- quantize -----------------------------------------------------------------------------------

#[test]
fn quantize_matches_an_independent_e4m3_reference() {
    let mut rng = Rng::new("quantize");
    let ctx = Context::cpu().unwrap();
    let n = 4096;
    // magnitudes from E4M3's subnormals to beyond 448 after scaling
    let x = rng.spread(n, -14, 10);
    let scale = (0.5 + rng.uniform() * 2.0) as f32;
    let xt = Tensor::from_f32(&ctx, &[64, 64], &x).unwrap();
    let meta = Scaling::new(&ctx, &Recipe::default(), Dtype::E4M3).unwrap();
    meta.set_scale(scale).unwrap();
    meta.enable_stats(true).unwrap();
    let q = Tensor::new(&ctx, Dtype::E4M3, &[64, 64]).unwrap();
    q.set_scaling(Some(&meta)).unwrap();
    ctx.quantize(&xt, &q).unwrap();
    let codes = q.to_vec::<u8>().unwrap();

    let mut saturated = 0u64;
    for (i, (&xi, &c)) in x.iter().zip(&codes).enumerate() {
        let want = e4m3_encode(xi * scale);
        assert_eq!(
            c,
            want,
            "element {}: x = {:e}, scale = {}, got {:#04x} ({}), want {:#04x} ({})",
            i,
            xi,
            scale,
            c,
            e4m3_decode(c),
            want,
            e4m3_decode(want)
        );
        assert!(!e4m3_decode(c).is_nan(), "element {} quantized to NaN", i);
        if (xi * scale).abs() > 448.0 {
            saturated += 1;
        }
    }
    assert!(saturated > 0 && saturated < n as u64, "the data covers saturation ({} of {})", saturated, n);
    let st = meta.stats().unwrap();
    assert_eq!(st.quantized, n as u64);
    assert_eq!(st.saturated, saturated);

    // the meta recorded max|x|; dequantize gives code * scale_inv
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(meta.get().unwrap().amax, amax);
    // ... which its amax tensor shares (read-only: a write is refused)
    let at = meta.amax_tensor().unwrap();
    assert_eq!(at.to_vec::<f32>().unwrap(), vec![amax]);
    assert_eq!(at.copy_from_host(&[1.0f32]).unwrap_err().status, Status::InvalidArgument);
    assert_eq!(ctx.amax(&xt).unwrap(), amax);
    let scale_inv = q.scale_inv_value().unwrap();
    assert_eq!(scale_inv, 1.0 / scale);
    let d = Tensor::new(&ctx, Dtype::F32, &[64, 64]).unwrap();
    ctx.dequantize(&q, &d).unwrap();
    for (i, (&c, &v)) in codes.iter().zip(&d.to_vec::<f32>().unwrap()).enumerate() {
        assert_eq!(v, (e4m3_decode(c) as f32) * scale_inv, "dequantized element {}", i);
    }

    // NaN never passes silently: a NaN input gives a NaN code and an infinite amax record
    let mut xn = x.clone();
    xn[17] = f32::NAN;
    xt.copy_from_host(&xn).unwrap();
    ctx.quantize(&xt, &q).unwrap();
    let codes = q.to_vec::<u8>().unwrap();
    assert!(e4m3_decode(codes[17]).is_nan());
    assert!(!meta.get().unwrap().amax.is_finite());
}

#[test]
fn cast_rounds_like_the_reference() {
    let mut rng = Rng::new("cast");
    let ctx = Context::cpu().unwrap();
    let x = rng.spread(1000, -12, 10);
    let src = Tensor::from_f32(&ctx, &[1000], &x).unwrap();
    let dst = Tensor::new(&ctx, Dtype::E4M3, &[1000]).unwrap();
    ctx.cast(&src, &dst).unwrap();
    let got = dst.to_vec::<u8>().unwrap();
    for (i, (&xi, &c)) in x.iter().zip(&got).enumerate() {
        assert_eq!(c, e4m3_encode(xi), "element {} = {:e}", i, xi);
    }
}

// ---- the Linear ---------------------------------------------------------------------------------

#[test]
fn linear_forward_and_backward_match_float64_within_fp8_tolerance() {
    let mut rng = Rng::new("linear");
    let ctx = Context::cpu().unwrap();
    let (m, k, n) = (24usize, 64usize, 40usize);
    let lin = Linear::new(&ctx, &linear_desc(k as i64, n as i64)).unwrap();
    let w = rng.spread(n * k, -4, 1);
    let b = rng.spread(n, -3, 0);
    lin.weight().unwrap().copy_from_host(&w).unwrap();
    lin.bias().unwrap().copy_from_host(&b).unwrap();
    let x = rng.spread(m * k, -3, 3);
    let xt = Tensor::from_f32(&ctx, &[m as i64, k as i64], &x).unwrap();
    let yt = Tensor::new(&ctx, Dtype::F32, &[m as i64, n as i64]).unwrap();
    lin.forward(&xt, &yt, true).unwrap();
    assert_eq!(lin.gemm_kind().unwrap(), GemmKind::Fp8);
    let y = yt.to_vec::<f32>().unwrap();

    // E4M3 keeps 3 mantissa bits: each operand is within 2^-4 relative (half an ulp) of its value,
    // plus the scaled range's underflow; the bias is rounded to BF16 (2^-8).
    let (mut max_err, mut any_diff) = (0f64, false);
    for i in 0..m {
        for j in 0..n {
            let (mut r, mut mag) = (b[j] as f64, 0f64);
            for kk in 0..k {
                r += x[i * k + kk] as f64 * w[j * k + kk] as f64;
                mag += (x[i * k + kk] as f64 * w[j * k + kk] as f64).abs();
            }
            let got = y[i * n + j] as f64;
            assert!(got.is_finite(), "y[{},{}] = {}", i, j, got);
            let tol = 0.14 * mag + (b[j] as f64).abs() * 2f64.powi(-8) + 1e-6;
            assert!((got - r).abs() <= tol, "y[{},{}] = {} vs float64 {} (tolerance {})", i, j, got, r, tol);
            max_err = max_err.max((got - r).abs() / mag.max(1e-30));
            any_diff |= got != r;
        }
    }
    assert!(any_diff, "FP8 results equal float64 everywhere: the GEMM did not run in FP8");
    eprintln!("linear: largest error / sum|x w| = {:.4}", max_err);

    // backward: dX = dY W, db = sum of dY's rows (F32 exactly up to summation order)
    let dy = rng.spread(m * n, -3, 1);
    let dyt = Tensor::from_f32(&ctx, &[m as i64, n as i64], &dy).unwrap();
    let dxt = Tensor::new(&ctx, Dtype::F32, &[m as i64, k as i64]).unwrap();
    lin.backward(&dyt, Some(&dxt), false).unwrap();
    let dx = dxt.to_vec::<f32>().unwrap();
    for i in 0..m {
        for kk in 0..k {
            let (mut r, mut mag) = (0f64, 0f64);
            for j in 0..n {
                r += dy[i * n + j] as f64 * w[j * k + kk] as f64;
                mag += (dy[i * n + j] as f64 * w[j * k + kk] as f64).abs();
            }
            let got = dx[i * k + kk] as f64;
            assert!(got.is_finite() && (got - r).abs() <= 0.14 * mag + 1e-6, "dx[{},{}] = {} vs {}", i, kk, got, r);
        }
    }
    let db = lin.bias_grad().unwrap().to_vec::<f32>().unwrap();
    for j in 0..n {
        let r: f64 = (0..m).map(|i| dy[i * n + j] as f64).sum();
        assert!((db[j] as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()), "db[{}] = {} vs {}", j, db[j], r);
    }
    // the weight gradient is E4M3 with its scale_inv: dW = dY^T X within FP8 tolerance
    let wg = lin.weight_grad().unwrap();
    assert_eq!(wg.dtype().unwrap(), Dtype::E4M3);
    let codes = wg.to_vec::<u8>().unwrap();
    let si = wg.scale_inv_value().unwrap() as f64;
    for j in 0..n {
        for kk in 0..k {
            let (mut r, mut mag) = (0f64, 0f64);
            for i in 0..m {
                r += dy[i * n + j] as f64 * x[i * k + kk] as f64;
                mag += (dy[i * n + j] as f64 * x[i * k + kk] as f64).abs();
            }
            let got = e4m3_decode(codes[j * k + kk]) * si;
            assert!(got.is_finite(), "dW[{},{}] is not finite", j, kk);
            assert!((got - r).abs() <= 0.2 * mag + 0.07 * r.abs() + 1e-6, "dW[{},{}] = {} vs {}", j, kk, got, r);
        }
    }
}

#[test]
fn linear_forward_fp8_matches_the_wide_forward_byte_for_byte() {
    // x quantized by the caller into a tensor bound to the Linear's INPUT meta (what a fused norm
    // writes) gives the bytes of the Linear quantizing the same x itself, backward included.
    let mut rng = Rng::new("linear_fp8");
    let ctx = Context::cpu().unwrap();
    let (m, k, n) = (20usize, 48usize, 24usize);
    let wide = Linear::new(&ctx, &linear_desc(k as i64, n as i64)).unwrap();
    let fed = Linear::new(&ctx, &linear_desc(k as i64, n as i64)).unwrap();
    let w = rng.spread(n * k, -4, 1);
    let b = rng.spread(n, -3, 0);
    for lin in [&wide, &fed] {
        lin.weight().unwrap().copy_from_host(&w).unwrap();
        lin.bias().unwrap().copy_from_host(&b).unwrap();
    }
    let x = rng.spread(m * k, -3, 3);
    let xt = Tensor::from_f32(&ctx, &[m as i64, k as i64], &x).unwrap();
    let x8 = Tensor::new(&ctx, Dtype::E4M3, &[m as i64, k as i64]).unwrap();
    x8.set_scaling(Some(&fed.scaling(Role::Input).unwrap())).unwrap();
    ctx.quantize(&xt, &x8).unwrap();
    let (ya, yb) = (
        Tensor::new(&ctx, Dtype::F32, &[m as i64, n as i64]).unwrap(),
        Tensor::new(&ctx, Dtype::F32, &[m as i64, n as i64]).unwrap(),
    );
    assert_eq!(fed.choose_gemm(m as i64, true).unwrap(), GemmKind::Fp8);
    assert_eq!(fed.choose_gemm(0, true).unwrap_err().status, Status::InvalidArgument);
    wide.forward(&xt, &ya, true).unwrap();
    fed.forward_fp8(&x8, &yb, true).unwrap();
    assert_eq!(ya.to_vec::<f32>().unwrap(), yb.to_vec::<f32>().unwrap());
    // a wide x8 is refused with DTYPE_MISMATCH
    let e = fed.forward_fp8(&xt, &yb, true).unwrap_err();
    assert_eq!(e.status, Status::DtypeMismatch, "{}", e);
    assert!(e.message.starts_with("fp8amp_linear_forward_fp8"), "message: {}", e.message);
    let dy = rng.spread(m * n, -3, 1);
    let dyt = Tensor::from_f32(&ctx, &[m as i64, n as i64], &dy).unwrap();
    let (dxa, dxb) = (
        Tensor::new(&ctx, Dtype::F32, &[m as i64, k as i64]).unwrap(),
        Tensor::new(&ctx, Dtype::F32, &[m as i64, k as i64]).unwrap(),
    );
    wide.backward(&dyt, Some(&dxa), false).unwrap();
    fed.backward(&dyt, Some(&dxb), false).unwrap();
    assert_eq!(dxa.to_vec::<f32>().unwrap(), dxb.to_vec::<f32>().unwrap());
    assert_eq!(wide.weight_grad().unwrap().to_vec::<u8>().unwrap(), fed.weight_grad().unwrap().to_vec::<u8>().unwrap());
    assert_eq!(wide.bias_grad().unwrap().to_vec::<f32>().unwrap(), fed.bias_grad().unwrap().to_vec::<f32>().unwrap());
}

// ---- the optimizer ------------------------------------------------------------------------------

#[test]
fn o2_adam_step_matches_float64_adamw() {
    let mut rng = Rng::new("adam");
    let ctx = Context::cpu().unwrap();
    let mut desc = AdamDesc::opt_level(OptLevel::O2).unwrap();
    assert_eq!(desc.exp_avg_dtype, Dtype::E4M3);
    assert_eq!(desc.exp_avg_sq_dtype, Dtype::F16);
    desc.lr = (1e-3 + rng.uniform() * 1e-2) as f32;
    let opt = Optimizer::new(&ctx, &desc).unwrap();
    let n = 1000;
    let p0 = rng.spread(n, -4, 2);
    let g = rng.spread(n, -10, 0);
    let p = Tensor::from_f32(&ctx, &[n as i64], &p0).unwrap();
    let gt = Tensor::from_f32(&ctx, &[n as i64], &g).unwrap();
    opt.add_param(&p, &gt).unwrap();
    assert_eq!(opt.num_params().unwrap(), 1);
    opt.step(&StepArgs::default()).unwrap();
    assert!(!opt.found_inf().unwrap());
    assert_eq!(opt.step_count().unwrap(), 1);
    let p1 = p.to_vec::<f32>().unwrap();

    // float64 AdamW, first step: m = (1-b1) g, v = (1-b2) g^2, bias-corrected to g and g^2.
    let (lr, b1, b2, eps, wd) =
        (desc.lr as f64, desc.beta1 as f64, desc.beta2 as f64, desc.eps as f64, desc.weight_decay as f64);
    let mut changed = 0;
    for i in 0..n {
        let gi = g[i] as f64;
        let m = (1.0 - b1) * gi / (1.0 - b1);
        let v = (1.0 - b2) * gi * gi / (1.0 - b2);
        let want = p0[i] as f64 * (1.0 - lr * wd) - lr * m / (v.sqrt() + eps);
        let got = p1[i] as f64;
        // m in E4M3 and v in F16 (block-scaled): the update's relative error stays within ~2^-4
        let tol = 0.07 * lr + 4.0 * f32::EPSILON as f64 * (p0[i] as f64).abs();
        assert!(
            got.is_finite() && (got - want).abs() <= tol,
            "p[{}] = {} vs float64 {} (tolerance {})",
            i,
            got,
            want,
            tol
        );
        changed += (p1[i] != p0[i]) as usize;
    }
    assert!(changed > n / 2, "the step changed only {} of {} parameters", changed, n);
    assert!(opt.state_bytes().unwrap() > 0);

    // a NaN gradient never passes: found_inf, and nothing changes
    let mut gn = rng.spread(n, -10, 0);
    gn[rng.next_u64() as usize % n] = f32::NAN;
    gt.copy_from_host(&gn).unwrap();
    opt.step(&StepArgs::default()).unwrap();
    assert!(opt.found_inf().unwrap());
    assert_eq!(p.to_vec::<f32>().unwrap(), p1);
    assert_eq!(opt.step_count().unwrap(), 1);

    // a checkpoint round trip
    let ck = opt.save().unwrap();
    opt.load(&ck).unwrap();
    let mut bad = ck.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x55;
    assert_eq!(opt.load(&bad).unwrap_err().status, Status::CorruptData);
}

// ---- threads ------------------------------------------------------------------------------------

#[test]
fn contexts_on_threads_are_independent_and_a_context_moves() {
    let mut rng = Rng::new("threads");
    let x = rng.spread(4096, -8, 8);
    let run = move |x: Vec<f32>, ctx: Context| -> Vec<u8> {
        let meta = Scaling::new(&ctx, &Recipe::current(), Dtype::E4M3).unwrap();
        let xt = Tensor::from_f32(&ctx, &[4096], &x).unwrap();
        let q = Tensor::new(&ctx, Dtype::E4M3, &[4096]).unwrap();
        q.set_scaling(Some(&meta)).unwrap();
        let mut out = Vec::new();
        for _ in 0..50 {
            ctx.quantize(&xt, &q).unwrap();
            out = q.to_vec::<u8>().unwrap();
        }
        out
    };
    // contexts made here and moved (Send) into threads that use them at the same time
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let ctx = Context::cpu().unwrap();
            let x = x.clone();
            std::thread::spawn(move || run(x, ctx))
        })
        .collect();
    let results: Vec<Vec<u8>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let here = run(x, Context::cpu().unwrap());
    for r in &results {
        assert_eq!(r, &here);
    }
    // errors are per thread: a failure on another thread leaves this thread's message alone
    let ctx = Context::cpu().unwrap();
    let e1 = Tensor::new(&ctx, Dtype::F32, &[0]).unwrap_err();
    std::thread::spawn(|| {
        let c = Context::cpu().unwrap();
        let _ = Tensor::new(&c, Dtype::F32, &[1, 2]).unwrap().copy_from_host(&[1.0f32]);
    })
    .join()
    .unwrap();
    let msg = unsafe { std::ffi::CStr::from_ptr(sys::fp8amp_last_error_message()) };
    assert_eq!(msg.to_str().unwrap(), e1.message);
}

#[test]
fn version_and_names() {
    assert!(fp8amp::version() >= 300);
    assert_eq!(Dtype::E4M3.size(), 1);
    assert_eq!(Dtype::BF16.size(), 2);
    assert_eq!(Status::ShapeMismatch.name(), "FP8AMP_ERROR_SHAPE_MISMATCH");
    assert_eq!(Status::from_raw(99), Some(Status::Other(99)));
    let r = Recipe::default();
    assert_eq!(r.amax_history_len, 1024);
    assert_eq!(fp8amp::Device::count(fp8amp::DeviceType::Cpu).unwrap(), 1);
}

#[test]
fn grad_scaler_backs_off_on_a_nan_step() {
    let mut rng = Rng::new("scaler");
    let ctx = Context::cpu().unwrap();
    let desc = fp8amp::GradScaler::default_desc().unwrap();
    assert_eq!(desc.init_scale, 65536.0);
    let scaler = fp8amp::GradScaler::new(&ctx, &desc).unwrap();
    let opt = Optimizer::new(&ctx, &AdamDesc::opt_level(OptLevel::O2).unwrap()).unwrap();
    let n = 300;
    let p0 = rng.spread(n, -3, 1);
    let p = Tensor::from_f32(&ctx, &[n as i64], &p0).unwrap();
    let mut g = rng.spread(n, 0, 10); // scaled gradients, as a scaled loss gives them
    let gt_first = g.clone();
    let gt = Tensor::from_f32(&ctx, &[n as i64], &g).unwrap();
    opt.add_param(&p, &gt).unwrap();
    let args = StepArgs { scaler: Some(&scaler), ..StepArgs::default() };
    opt.step(&args).unwrap();
    assert!(!opt.found_inf().unwrap());
    assert_eq!(scaler.scale().unwrap(), 65536.0);
    let p1 = p.to_vec::<f32>().unwrap();
    assert!(p1.iter().zip(&p0).any(|(a, b)| a != b) && p1.iter().all(|v| v.is_finite()));
    g[rng.next_u64() as usize % n] = f32::INFINITY;
    gt.copy_from_host(&g).unwrap();
    opt.step(&args).unwrap();
    assert!(opt.found_inf().unwrap());
    // the state of the one good step, as stored: after one step m = (1 - beta1) g / scale in E4M3
    // with a block scale per 128 elements (within half an E4M3 step), v in F16 with its scales
    let st = opt.param_state(0).unwrap();
    assert!(!st.has_master && st.step == 1 && st.master.is_none() && st.param_meta_history.is_none());
    assert_eq!(st.exp_avg.dtype().unwrap(), Dtype::E4M3);
    assert_eq!(st.exp_avg_sq.dtype().unwrap(), Dtype::F16);
    let (codes, si) = (st.exp_avg.to_vec::<u8>().unwrap(), st.exp_avg_scale_inv.as_ref().unwrap().to_vec::<f32>().unwrap());
    assert_eq!((codes.len(), si.len()), (n, (n + 127) / 128));
    for (i, &c) in codes.iter().enumerate() {
        let want = 0.1 * (gt_first[i] as f64) / 65536.0;
        let got = e4m3_decode(c) * si[i / 128] as f64;
        // half an E4M3 step: 2^-4 relative for normal codes, half the smallest subnormal (2^-10) below
        assert!((got - want).abs() <= want.abs() / 16.0 * 1.0001 + (si[i / 128] as f64) / 1024.0,
                "m element {}: {} against {}", i, got, want);
    }
    assert!(opt.param_state(1).is_err());
    assert_eq!(scaler.scale().unwrap(), 32768.0);
    assert_eq!(p.to_vec::<f32>().unwrap(), p1);
    let st = scaler.state().unwrap();
    scaler.set_state(&fp8amp::GradScalerState { scale: 1024.0, ..st }).unwrap();
    assert_eq!(scaler.scale().unwrap(), 1024.0);
    let e = scaler.set_state(&fp8amp::GradScalerState { scale: f32::NAN, ..st }).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{}", e);
    assert_eq!(scaler.scale().unwrap(), 1024.0);
}

#[test]
fn optimizer_state_moves_between_optimizers() {
    let mut rng = Rng::new("set_param_state");
    let ctx = Context::cpu().unwrap();
    let desc = AdamDesc::opt_level(OptLevel::O2).unwrap();
    let (a, b) = (Optimizer::new(&ctx, &desc).unwrap(), Optimizer::new(&ctx, &desc).unwrap());
    let n = 300;
    let shape = [n as i64];
    let p0 = rng.spread(n, -3, 1);
    let (pa, pb) = (Tensor::from_f32(&ctx, &shape, &p0).unwrap(), Tensor::from_f32(&ctx, &shape, &p0).unwrap());
    let zeros = vec![0f32; n];
    let (ga, gb) = (Tensor::from_f32(&ctx, &shape, &zeros).unwrap(), Tensor::from_f32(&ctx, &shape, &zeros).unwrap());
    a.add_param(&pa, &ga).unwrap();
    b.add_param(&pb, &gb).unwrap();
    for _ in 0..3 {
        ga.copy_from_host(&rng.spread(n, -2, 1)).unwrap();
        a.step(&StepArgs::default()).unwrap();
    }
    // b takes a's state (stored form, bit for bit), step count and parameter values: the next step
    // with the same gradient gives both the same bytes
    let st = a.param_state(0).unwrap();
    b.set_param_state(0, &ParamStateIn::from_state(&st)).unwrap();
    b.set_step(a.step_count().unwrap()).unwrap();
    pb.copy_from_host(&pa.to_vec::<f32>().unwrap()).unwrap();
    let g = rng.spread(n, -2, 1);
    ga.copy_from_host(&g).unwrap();
    gb.copy_from_host(&g).unwrap();
    a.step(&StepArgs::default()).unwrap();
    b.step(&StepArgs::default()).unwrap();
    assert_eq!(pa.to_vec::<f32>().unwrap(), pb.to_vec::<f32>().unwrap());
    let (sa, sb) = (a.param_state(0).unwrap(), b.param_state(0).unwrap());
    assert_eq!(sa.exp_avg.to_vec::<u8>().unwrap(), sb.exp_avg.to_vec::<u8>().unwrap());
    assert_eq!(sa.exp_avg_sq.to_vec::<u16>().unwrap(), sb.exp_avg_sq.to_vec::<u16>().unwrap());
    assert_eq!(b.step_count().unwrap(), 4);
    // the values form: F32 m and v quantized with the optimizer's block scaling (m within half an
    // E4M3 step of each value: 2^-4 relative for normal codes, half the smallest subnormal below)
    let m = rng.spread(n, -4, 1);
    let v: Vec<f32> = rng.spread(n, -6, 0).iter().map(|x| x.abs()).collect();
    let (mt, vt) = (Tensor::from_f32(&ctx, &shape, &m).unwrap(), Tensor::from_f32(&ctx, &shape, &v).unwrap());
    let values = ParamStateIn { exp_avg: &mt, exp_avg_scale_inv: None, exp_avg_sq: &vt, exp_avg_sq_scale_inv: None,
                                master: None, master_scale_inv: None, param_meta: None };
    b.set_param_state(0, &values).unwrap();
    let st = b.param_state(0).unwrap();
    let (codes, si) = (st.exp_avg.to_vec::<u8>().unwrap(), st.exp_avg_scale_inv.as_ref().unwrap().to_vec::<f32>().unwrap());
    for i in 0..n {
        let (got, want) = (e4m3_decode(codes[i]) * si[i / 128] as f64, m[i] as f64);
        assert!((got - want).abs() <= want.abs() / 16.0 * 1.0001 + (si[i / 128] as f64) / 1024.0,
                "m element {}: {} against {}", i, got, want);
    }
    // refusals change nothing: a shape that is not the parameter's, a master for a parameter without one
    let before = (st.exp_avg.to_vec::<u8>().unwrap(), st.exp_avg_sq.to_vec::<u16>().unwrap());
    let short = Tensor::from_f32(&ctx, &[(n - 1) as i64], &m[..n - 1]).unwrap();
    let e = b.set_param_state(0, &ParamStateIn { exp_avg: &short, ..values }).unwrap_err();
    assert_eq!(e.status, Status::ShapeMismatch, "{}", e);
    let e = b.set_param_state(0, &ParamStateIn { master: Some(&mt), ..values }).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{}", e);
    assert!(b.set_param_state(1, &values).is_err());
    assert!(b.set_step(-1).is_err());
    let st = b.param_state(0).unwrap();
    assert_eq!((st.exp_avg.to_vec::<u8>().unwrap(), st.exp_avg_sq.to_vec::<u16>().unwrap()), before);
    assert_eq!(b.step_count().unwrap(), 4);
}
