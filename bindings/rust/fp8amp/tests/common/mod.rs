//! Shared by the tests: a seeded generator (the seed is printed; FP8AMP_TEST_SEED replays it) and
//! an E4M3 reference written here, independent of the library's codec.
#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

/// splitmix64: small, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// Seeded from FP8AMP_TEST_SEED or the clock; prints the seed so a failure can be replayed.
    pub fn new(test: &str) -> Rng {
        let seed = match std::env::var("FP8AMP_TEST_SEED") {
            Ok(s) => s.parse().expect("FP8AMP_TEST_SEED is an integer"),
            Err(_) => SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64,
        };
        eprintln!("{}: seed {} (FP8AMP_TEST_SEED={} replays it)", test, seed, seed);
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [-1, 1), never exactly 0.
    pub fn signed(&mut self) -> f32 {
        loop {
            let v = (self.uniform() * 2.0 - 1.0) as f32;
            if v != 0.0 {
                return v;
            }
        }
    }
    /// Nonzero values of both signs spread over magnitudes 2^lo .. 2^hi.
    pub fn spread(&mut self, n: usize, lo: i32, hi: i32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let e = lo + (self.uniform() * (hi - lo + 1) as f64) as i32;
                self.signed() * 2f32.powi(e)
            })
            .collect()
    }
}

/// The value of an E4M3 (e4m3fn) code: bias 7, 3 mantissa bits, no infinities, S.1111.111 NaN.
pub fn e4m3_decode(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> 3) & 0xF) as i32;
    let m = (code & 7) as f64;
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    let mag = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
    sign * mag
}

/// Round to the nearest E4M3 value, ties to the even code, saturating to +-448; NaN to NaN.
/// A search over the 127 non-negative codes: no bit tricks shared with the library's codec.
pub fn e4m3_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F | if x.is_sign_negative() { 0x80 } else { 0 };
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = (x as f64).abs().min(448.0);
    let mut best = 0u8;
    for code in 0u8..=0x7E {
        let (d, db) = ((e4m3_decode(code) - a).abs(), (e4m3_decode(best) - a).abs());
        if d < db || (d == db && code % 2 == 0 && best % 2 == 1) {
            best = code;
        }
    }
    // -0 keeps its sign bit, like IEEE conversions
    best | sign
}
