//! Conversions between the float8 dtypes ([`DType::F8E4M3Fn`], [`DType::F8E5M2`]) and
//! `f32`/`f64`. Rust has no float8 type, so ferry moves them as bytes; these functions are
//! for the few places that compute on elements (printing, the demo and conformance APIs).
//!
//! - Decoding is exact (every float8 value is an `f32`).
//! - Encoding rounds to nearest, ties to even, as torch and ml_dtypes do, and handles
//!   overflow as they do: `e4m3fn` has no infinity, so a value past its largest finite
//!   (448, after rounding) or an infinity becomes NaN; `e5m2` overflows to ±infinity.
//!   NaN stays NaN (sign kept; the payload is not).
//!
//! [`DType::F8E4M3Fn`]: crate::DType::F8E4M3Fn
//! [`DType::F8E5M2`]: crate::DType::F8E5M2

/// The NaN of `e4m3fn` (`S.1111.111`, positive sign).
pub const E4M3FN_NAN: u8 = 0x7f;
/// The quiet NaN of `e5m2` (`S.11111.10`, positive sign).
pub const E5M2_NAN: u8 = 0x7e;
/// Positive infinity of `e5m2`.
pub const E5M2_INF: u8 = 0x7c;

/// The value of `e4m3fn` bits.
pub fn e4m3fn_to_f32(bits: u8) -> f32 {
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 3) & 0xf);
    let man = f32::from(bits & 0x7);
    if exp == 0xf && bits & 0x7 == 0x7 {
        return f32::NAN.copysign(sign);
    }
    if exp == 0 {
        return sign * man * 2f32.powi(-9); // subnormal: 2^(1-7) * man/8
    }
    sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
}

/// The value of `e5m2` bits (the upper byte of an f16).
pub fn e5m2_to_f32(bits: u8) -> f32 {
    half::f16::from_bits(u16::from(bits) << 8).to_f32()
}

/// The `e4m3fn` bits nearest to `x` (ties to even; overflow and infinities become NaN).
pub fn f64_to_e4m3fn(x: f64) -> u8 {
    encode(x, Format { man_bits: 3, bias: 7, max_finite: 0x7e, overflow: E4M3FN_NAN, inf: E4M3FN_NAN, nan: E4M3FN_NAN })
}

/// The `e5m2` bits nearest to `x` (ties to even; overflow becomes infinity).
pub fn f64_to_e5m2(x: f64) -> u8 {
    encode(x, Format { man_bits: 2, bias: 15, max_finite: 0x7b, overflow: E5M2_INF, inf: E5M2_INF, nan: E5M2_NAN })
}

/// [`f64_to_e4m3fn`] of an `f32` (exact: every `f32` is an `f64`).
pub fn f32_to_e4m3fn(x: f32) -> u8 {
    f64_to_e4m3fn(f64::from(x))
}

/// [`f64_to_e5m2`] of an `f32`.
pub fn f32_to_e5m2(x: f32) -> u8 {
    f64_to_e5m2(f64::from(x))
}

struct Format {
    man_bits: u32,
    bias: i32,
    /// The bits (without sign) of the largest finite value.
    max_finite: u8,
    /// What a finite value rounding past `max_finite` becomes.
    overflow: u8,
    inf: u8,
    nan: u8,
}

fn encode(x: f64, f: Format) -> u8 {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return sign | f.nan;
    }
    if x.is_infinite() {
        return sign | f.inf;
    }
    let a = x.abs();
    let min_exp = 1 - f.bias; // exponent of the smallest normal
    if a < 2f64.powi(min_exp) {
        // Subnormal (or zero): a multiple of 2^(min_exp - man_bits). Scaling by a power of
        // two is exact, so the rounding below is the only one. A result of 2^man_bits is the
        // smallest normal, whose encoding is that same integer.
        let n = (a * 2f64.powi(f.man_bits as i32 - min_exp)).round_ties_even();
        return sign | n as u8;
    }
    let b = a.to_bits();
    let exp = ((b >> 52) & 0x7ff) as i32 - 1023; // `a` is normal here
    let man = b & ((1u64 << 52) - 1);
    let shift = 52 - f.man_bits;
    let Ok(biased) = u64::try_from(exp + f.bias) else { return sign | f.overflow };
    let mut r = (biased.min(0xff) << f.man_bits) | (man >> shift);
    let rem = man & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    if rem > half || (rem == half && r & 1 == 1) {
        r += 1; // a carry into the exponent is right
    }
    if r > u64::from(f.max_finite) {
        return sign | f.overflow;
    }
    sign | r as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3fn_values() {
        assert_eq!(e4m3fn_to_f32(0x00), 0.0);
        assert!(e4m3fn_to_f32(0x80).is_sign_negative());
        assert_eq!(e4m3fn_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3fn_to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(e4m3fn_to_f32(0x38), 1.0);
        assert_eq!(e4m3fn_to_f32(0x3c), 1.5);
        assert_eq!(e4m3fn_to_f32(0xc0), -2.0);
        assert_eq!(e4m3fn_to_f32(0x7e), 448.0);
        assert_eq!(e4m3fn_to_f32(0x78), 256.0); // exponent 15 holds finite values
        assert!(e4m3fn_to_f32(0x7f).is_nan() && e4m3fn_to_f32(0xff).is_nan());
        assert_eq!(f64_to_e4m3fn(448.0), 0x7e);
        assert_eq!(f64_to_e4m3fn(464.0), 0x7e); // tie between 448 and 480: even
        assert_eq!(f64_to_e4m3fn(464.1), E4M3FN_NAN);
        assert_eq!(f64_to_e4m3fn(-1e9), 0x80 | E4M3FN_NAN);
        assert_eq!(f64_to_e4m3fn(f64::INFINITY), E4M3FN_NAN);
        assert_eq!(f64_to_e4m3fn(f64::NAN), E4M3FN_NAN);
        assert_eq!(f64_to_e4m3fn(1.0625), 0x38); // tie between 1 and 1.125: even
        assert_eq!(f64_to_e4m3fn(1.1875), 0x3a); // tie between 1.125 and 1.25: even
        assert_eq!(f64_to_e4m3fn(62.5), f64_to_e4m3fn(64.0)); // between 60 and 64, nearer 64
        assert_eq!(f64_to_e4m3fn(2f64.powi(-10)), 0x00); // half the smallest subnormal: even
        assert_eq!(f64_to_e4m3fn(3.0 * 2f64.powi(-10)), 0x02);
        assert_eq!(f64_to_e4m3fn(-0.0), 0x80);
        assert_eq!(f64_to_e4m3fn(1e-300), 0x00);
    }

    #[test]
    fn e5m2_values() {
        assert_eq!(e5m2_to_f32(0x3c), 1.0);
        assert_eq!(e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(e5m2_to_f32(0x7c), f32::INFINITY);
        assert_eq!(e5m2_to_f32(0xfc), f32::NEG_INFINITY);
        assert!(e5m2_to_f32(0x7e).is_nan());
        assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
        assert_eq!(f64_to_e5m2(57344.0), 0x7b);
        assert_eq!(f64_to_e5m2(61440.0), E5M2_INF); // tie between 57344 and 65536: even is inf
        assert_eq!(f64_to_e5m2(61439.0), 0x7b);
        assert_eq!(f64_to_e5m2(-f64::INFINITY), 0x80 | E5M2_INF);
        assert_eq!(f64_to_e5m2(f64::NAN), E5M2_NAN);
        assert_eq!(f64_to_e5m2(1.125), 0x3c); // tie between 1 and 1.25: even
        assert_eq!(f64_to_e5m2(-62.5), 0xd4); // -64 (between -56 and -64, nearer -64)
    }

    #[test]
    fn every_value_round_trips() {
        for b in 0..=255u8 {
            let v = e4m3fn_to_f32(b);
            if v.is_nan() {
                assert_eq!(f32_to_e4m3fn(v) & 0x7f, E4M3FN_NAN);
            } else {
                assert_eq!(f32_to_e4m3fn(v), b, "e4m3fn {b:#04x} = {v}");
            }
            let v = e5m2_to_f32(b);
            if v.is_nan() {
                assert!(e5m2_to_f32(f32_to_e5m2(v)).is_nan());
            } else {
                assert_eq!(f32_to_e5m2(v), b, "e5m2 {b:#04x} = {v}");
            }
        }
    }

    #[test]
    fn e5m2_encoding_agrees_with_f16_rounding() {
        // e5m2 is f16 with 8 fewer mantissa bits: rounding an f16 value whose low byte is
        // not a tie must agree with half's own rounding of the same f32.
        for hi in 0..0x7bu16 {
            for lo in [0x00u16, 0x01, 0x7f, 0x81, 0xff] {
                let x = half::f16::from_bits((hi << 8) | lo).to_f64();
                let want = if lo < 0x80 { hi } else { hi + 1 } as u8;
                assert_eq!(f64_to_e5m2(x), want, "{x}");
            }
        }
    }
}
