//! Element types and their Rust counterparts.

use std::fmt;

/// The element types Calico knows. fp8 types are declared for the Arch descriptor and the
/// kernels that will use them; ops reject them until they are implemented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    BF16,
    F16,
    F32,
    /// fp8 with 4 exponent bits and 3 mantissa bits (OCP flavour on NVIDIA and CDNA4, FNUZ on CDNA3).
    F8E4M3,
    /// fp8 with 5 exponent bits and 2 mantissa bits.
    F8E5M2,
    /// 32-bit signed integers: offsets, block tables and lengths (attention's cu_seqlens,
    /// paged-KV block tables). Float ops reject it.
    I32,
}

impl DType {
    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F8E4M3 | DType::F8E5M2 => 1,
        }
    }

    /// Short lower-case name, as used in kernel defines and reports.
    pub const fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::I32 => "i32",
        }
    }

    /// The device-side C++ type name in Calico's device vocabulary (`calico/types.h`).
    pub const fn device_type(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "float",
            DType::F8E4M3 => "fp8e4m3",
            DType::F8E5M2 => "fp8e5m2",
            DType::I32 => "int",
        }
    }

    /// True for the float types every op accepts as storage (bf16, f16, f32).
    pub const fn is_standard_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// Parses a name written by [`DType::name`].
    pub fn parse(name: &str) -> Option<DType> {
        [
            DType::BF16,
            DType::F16,
            DType::F32,
            DType::F8E4M3,
            DType::F8E5M2,
            DType::I32,
        ]
        .into_iter()
        .find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be stored in a [`crate::Tensor`].
pub trait Element: bytemuck::Pod + Send + Sync + fmt::Debug + 'static {
    /// The dtype this Rust type stores as.
    const DTYPE: DType;
    /// Converts to f64 (for references and checks).
    fn to_f64(self) -> f64;
    /// Converts from f64 with round-to-nearest-even.
    fn from_f64(v: f64) -> Self;
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        let r = round_via_f32(
            v,
            |f| half::bf16::from_f32(f).to_bits(),
            |b| half::bf16::from_bits(b).to_f64(),
        );
        half::bf16::from_bits(r)
    }
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        let r = round_via_f32(
            v,
            |f| half::f16::from_f32(f).to_bits(),
            |b| half::f16::from_bits(b).to_f64(),
        );
        half::f16::from_bits(r)
    }
}

/// Rounds `v` to a 16-bit float (given as bits by `from_f32`, valued by `value`) to nearest even.
/// Going through f32 (whose conversions are exact RNE) can round twice the wrong way only when
/// the f32 lands exactly halfway between two 16-bit values that `v` itself is not halfway
/// between; that case is decided here by `v`. (half's own from_f64 judges ties from the upper
/// 32 bits of the f64 only, and misrounds values just above a tie.)
fn round_via_f32(v: f64, from_f32: impl Fn(f32) -> u16, value: impl Fn(u16) -> f64) -> u16 {
    let f = v as f32;
    let r = from_f32(f);
    let (fv, rv) = (f as f64, value(r));
    if fv == v || !f.is_finite() || !rv.is_finite() || fv == rv {
        return r;
    }
    // The neighbour of r on f's side (16-bit floats are sign-magnitude).
    let toward_larger_magnitude = (fv > rv) == (r & 0x8000 == 0);
    let other = if toward_larger_magnitude {
        r.wrapping_add(1)
    } else {
        r.wrapping_sub(1)
    };
    let ov = value(other);
    let mid = (rv + ov) / 2.0;
    if fv == mid && (v > mid) == (ov > mid) {
        other
    } else {
        r
    }
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    /// Rounds to the nearest integer, saturating at the i32 range (NaN becomes 0).
    fn from_f64(v: f64) -> Self {
        v.round() as i32
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

/// Reads element `i` of a little-endian byte buffer of `dtype` as f32 (bf16/f16/f32 only;
/// i32 is converted, exact below 2^24).
pub fn read_f32(dtype: DType, bytes: &[u8], i: usize) -> f32 {
    match dtype {
        DType::BF16 => {
            half::bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
        }
        DType::F16 => {
            half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
        }
        DType::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes")),
        DType::I32 => {
            i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes")) as f32
        }
        DType::F8E4M3 | DType::F8E5M2 => {
            unreachable!("fp8 storage is rejected before element access")
        }
    }
}

/// Writes `v` as element `i` of a little-endian byte buffer of `dtype` (bf16/f16/f32 only).
pub fn write_f32(dtype: DType, bytes: &mut [u8], i: usize, v: f32) {
    match dtype {
        DType::BF16 => bytes[2 * i..2 * i + 2]
            .copy_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
        DType::F16 => {
            bytes[2 * i..2 * i + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes())
        }
        DType::F32 => bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        DType::I32 => bytes[4 * i..4 * i + 4].copy_from_slice(&(v.round() as i32).to_le_bytes()),
        DType::F8E4M3 | DType::F8E5M2 => {
            unreachable!("fp8 storage is rejected before element access")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in [
            DType::BF16,
            DType::F16,
            DType::F32,
            DType::F8E4M3,
            DType::F8E5M2,
            DType::I32,
        ] {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::parse("f64"), None);
    }

    #[test]
    fn from_f64_rounds_to_nearest_even_just_above_and_below_ties() {
        let tie = 5.203125; // halfway between the bf16 values 5.1875 and 5.21875
        let above = tie + 2f64.powi(-21);
        let below = tie - 2f64.powi(-21);
        assert_eq!(<half::bf16 as Element>::from_f64(tie).to_f64(), 5.1875); // to even
        assert_eq!(<half::bf16 as Element>::from_f64(above).to_f64(), 5.21875);
        assert_eq!(<half::bf16 as Element>::from_f64(below).to_f64(), 5.1875);
        assert_eq!(<half::bf16 as Element>::from_f64(-above).to_f64(), -5.21875);
        // f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
        let t16 = 1.0 + 2f64.powi(-11);
        assert_eq!(<half::f16 as Element>::from_f64(t16).to_f64(), 1.0);
        assert_eq!(
            <half::f16 as Element>::from_f64(t16 + 2f64.powi(-40)).to_f64(),
            1.0 + 2f64.powi(-10)
        );
        assert_eq!(
            <half::f16 as Element>::from_f64(t16 - 2f64.powi(-40)).to_f64(),
            1.0
        );
        // Every f64 that is exactly an f32 rounds as the f32 does.
        for bits in (0u32..=u32::MAX).step_by(9_973) {
            let f = f32::from_bits(bits);
            if f.is_finite() {
                assert_eq!(
                    <half::bf16 as Element>::from_f64(f as f64),
                    half::bf16::from_f32(f)
                );
            }
        }
    }

    #[test]
    fn byte_access_round_trips() {
        let mut buf = vec![0u8; 16];
        for d in [DType::BF16, DType::F16, DType::F32] {
            write_f32(d, &mut buf, 1, 1.5);
            assert_eq!(read_f32(d, &buf, 1), 1.5);
        }
    }
}
