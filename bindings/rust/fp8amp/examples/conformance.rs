//! The Rust runner of the conformance scenario (tests/conformance/SCENARIO.md): one fixed
//! computation on a CPU context, written as raw little-endian bytes to the path given as the only
//! argument, for `tests/conformance/compare.py` to compare with the C runner's file byte for byte.
//!
//! `cargo run --offline --example conformance -- OUT.bin`; exits 0 on success, 1 with the library's
//! status and message on stderr on any failed call, 2 on a usage error.
use fp8amp::{
    AdamDesc, Context, Dtype, GemmPolicy, Linear, LinearDesc, OptLevel, Optimizer, Recipe, Scaling, StepArgs, Tensor,
};
use std::io::Write;

/// The scenario's inputs: `(float)(f(i)) / d` with IEEE float32 division, as every runner computes them.
fn input(n: usize, f: impl Fn(i64) -> i64, d: f32) -> Vec<f32> {
    (0..n as i64).map(|i| f(i) as f32 / d).collect()
}

fn bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_u16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn run() -> fp8amp::Result<Vec<u8>> {
    let x = input(16 * 32, |i| (i * 7919) % 2003 - 1001, 173.0);
    let w = input(24 * 32, |i| (i * 104729) % 1999 - 999, 4096.0);
    let b = input(24, |i| (i * 31) % 17 - 8, 64.0);
    let dy = input(16 * 24, |i| (i * 31337) % 997 - 498, 256.0);
    let mut out = Vec::with_capacity(8648);

    let ctx = Context::cpu()?;

    // 1. quantize / dequantize with a meta of the default recipe, scale 4
    let xt = Tensor::from_f32(&ctx, &[16, 32], &x)?;
    let meta = Scaling::new(&ctx, &Recipe::default(), Dtype::E4M3)?;
    meta.set_scale(4.0)?;
    let q = Tensor::new(&ctx, Dtype::E4M3, &[16, 32])?;
    q.set_scaling(Some(&meta))?;
    ctx.quantize(&xt, &q)?;
    let d = Tensor::new(&ctx, Dtype::F32, &[16, 32])?;
    ctx.dequantize(&q, &d)?;
    out.extend(q.to_vec::<u8>()?);
    out.extend(bytes_f32(&d.to_vec::<f32>()?));

    // 2. Linear forward and backward: BF16 weight, E4M3 weight gradient, FP8 GEMMs always
    let mut desc = LinearDesc::new(32, 24)?;
    desc.has_bias = true;
    desc.weight_dtype = Dtype::BF16;
    desc.wgrad_dtype = Dtype::E4M3;
    desc.policy = GemmPolicy::AlwaysFp8;
    let lin = Linear::new(&ctx, &desc)?;
    let weight = lin.weight()?;
    let bias = lin.bias()?;
    ctx.cast(&Tensor::from_f32(&ctx, &[24, 32], &w)?, &weight)?;
    bias.copy_from_host(&b)?;
    let y = Tensor::new(&ctx, Dtype::F32, &[16, 24])?;
    lin.forward(&xt, &y, true)?;
    let dyt = Tensor::from_f32(&ctx, &[16, 24], &dy)?;
    let dx = Tensor::new(&ctx, Dtype::F32, &[16, 32])?;
    lin.backward(&dyt, Some(&dx), false)?;
    let wgrad = lin.weight_grad()?;
    let bgrad = lin.bias_grad()?;
    out.extend(bytes_f32(&y.to_vec::<f32>()?));
    out.extend(bytes_f32(&dx.to_vec::<f32>()?));
    out.extend(wgrad.to_vec::<u8>()?);
    out.extend(wgrad.scale_inv_value()?.to_le_bytes());
    out.extend(bytes_f32(&bgrad.to_vec::<f32>()?));

    // 3. one O2 Adam step, lr 1e-3, weight then bias
    let mut adam = AdamDesc::opt_level(OptLevel::O2)?;
    adam.lr = 1e-3;
    let opt = Optimizer::new(&ctx, &adam)?;
    opt.add_param(&weight, &wgrad)?;
    opt.add_param(&bias, &bgrad)?;
    opt.step(&StepArgs::default())?;
    out.extend(bytes_u16(&weight.to_vec::<u16>()?));
    out.extend(bytes_f32(&bias.to_vec::<f32>()?));
    out.extend((opt.found_inf()? as i32).to_le_bytes());
    assert_eq!(out.len(), 8648, "the scenario's records are 8648 bytes");
    // The optimizer's checkpoint after the step: its length (u64, little-endian) and its bytes.
    let checkpoint = opt.save()?;
    out.extend((checkpoint.len() as u64).to_le_bytes());
    out.extend(checkpoint);
    Ok(out)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 2 {
        eprintln!("usage: {} OUTPUT_FILE", args.first().map(String::as_str).unwrap_or("conformance"));
        std::process::exit(2);
    }
    let bytes = match run() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("conformance (Rust): {}", e);
            std::process::exit(1);
        }
    };
    let written = std::fs::File::create(&args[1]).and_then(|mut f| f.write_all(&bytes));
    if let Err(e) = written {
        eprintln!("conformance (Rust): cannot write {}: {}", args[1], e);
        std::process::exit(1);
    }
}
