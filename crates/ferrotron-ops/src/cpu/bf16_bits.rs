//! bf16 ↔ f32 in integer arithmetic without branches, so the AdamW loop around them vectorises.
//!
//! burn-flex casts f32 to bf16 through f64 (`bf16::from_f64(f64::from(x))`), and the optimizer
//! must give the composed casts' bits; half's `f64_to_bf16` branches on the value's class, which
//! keeps a loop that calls it scalar. Through f64 a normal f32 is rounded to nearest, ties to
//! even, with a sticky test that misses the three lowest mantissa bits (they land in the low
//! word of the f64, which half drops); a subnormal f32 becomes a normal f64 whose dropped low
//! word holds its lowest one or two bits when its leading bit is bit 21 or 22, none otherwise;
//! zeros and infinities need no rounding, and a NaN is quieted. [`bf16_from_f32`] is that, as
//! masks: the tests check it against `from_f64` on every f32 (`#[ignore]`d, 2³² values) and on
//! a sample of every class.

use burn::tensor::bf16;

/// `bf16::from_f64(f64::from(x))`, bit for bit.
#[inline(always)]
pub(crate) fn bf16_from_f32(x: f32) -> bf16 {
    let bits = x.to_bits();
    let magnitude = bits & 0x7FFF_FFFF;
    let truncated = bits >> 16;
    // f32 mantissa bits that `from_f64` does not see: the three lowest for a normal value; for
    // a subnormal, the lowest two (leading bit 22), the lowest (leading bit 21) or none.
    let leading = (bits >> 21) & 3;
    let unseen = if magnitude >= 0x0080_0000 {
        7
    } else {
        leading | (leading >> 1)
    };
    // the rounding bit set, and a sticky bit below it or the kept lowest bit (ties to even)
    let round_up = (bits & 0x8000 != 0) && (bits & 0x1_7FFF & !unseen != 0);
    let rounded = truncated + u32::from(round_up);
    let nan = magnitude > 0x7F80_0000;
    bf16::from_bits(if nan { truncated | 0x40 } else { rounded } as u16)
}

/// `x.to_f32()`, bit for bit: the bits shifted up, a NaN quieted.
#[inline(always)]
pub(crate) fn bf16_to_f32(x: bf16) -> f32 {
    let bits = x.to_bits();
    let quiet = if bits & 0x7FFF > 0x7F80 { 0x40 } else { 0 };
    f32::from_bits(u32::from(bits | quiet) << 16)
}
