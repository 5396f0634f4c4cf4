//! Per-dtype tolerances and the comparisons of an op's output with its f64 reference.
//!
//! Errors are measured against the largest reference magnitude (a row op's output spans a
//! few binades at most, so this is close to a relative error without blowing up near zero).
//! NaN and infinity never pass.

use calico::DType;

/// Below this, the reference is treated as zero-sized for scaling.
const TINY: f64 = 1e-30;

/// About four units of rounding of the storage dtype: output rounding plus f32 math.
pub fn elementwise_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        other => panic!("no tolerance for {other}"),
    }
}

/// Row ops reduce `cols` values in f32, whose rounding grows like sqrt(cols) ulps; that only
/// shows in f32 outputs (half types round it away).
pub fn row_tol(dtype: DType, cols: usize) -> f64 {
    let base = elementwise_tol(dtype);
    if dtype == DType::F32 {
        base * ((cols as f64).sqrt() / 16.0).max(1.0)
    } else {
        base
    }
}

/// GEMM tolerances for an output dtype: (normwise, elementwise against the largest value).
/// The elementwise bound catches a single wrong tile edge that a norm would average away.
pub fn gemm_tol(out: DType) -> (f64, f64) {
    match out {
        DType::F32 => (1e-4, 1e-3),
        d => (elementwise_tol(d), elementwise_tol(d)),
    }
}

fn same_len(what: &str, out: &[f64], reference: &[f64]) -> Result<(), String> {
    if out.len() != reference.len() {
        return Err(format!(
            "`{what}`: {} values, the reference has {}",
            out.len(),
            reference.len()
        ));
    }
    match reference.iter().position(|r| !r.is_finite()) {
        Some(i) => Err(format!(
            "`{what}`: reference[{i}] = {} (test bug)",
            reference[i]
        )),
        None => Ok(()),
    }
}

/// max |out - ref| / max |ref| <= tol.
pub fn check_close(what: &str, out: &[f64], reference: &[f64], tol: f64) -> Result<(), String> {
    same_len(what, out, reference)?;
    let scale = reference
        .iter()
        .fold(0.0f64, |m, r| m.max(r.abs()))
        .max(TINY);
    let mut worst: Option<(usize, f64)> = None;
    let mut bad = 0usize;
    for (i, (&o, &r)) in out.iter().zip(reference).enumerate() {
        // A NaN or infinite output counts as an infinite error (NaN would compare false).
        let err = if o.is_finite() {
            (o - r).abs() / scale
        } else {
            f64::INFINITY
        };
        if err > tol {
            bad += 1;
        }
        if worst.is_none_or(|(_, w)| err > w) {
            worst = Some((i, err));
        }
    }
    match worst {
        Some((i, err)) if bad > 0 => Err(format!(
            "`{what}`: {bad} of {} elements off; worst at {i}: got {}, expected {} \
             (error {err:.3e} of max |ref| {scale:.3e}, tolerance {tol:.1e})",
            out.len(),
            out[i],
            reference[i]
        )),
        _ => Ok(()),
    }
}

/// ||out - ref||_2 / ||ref||_2 <= tol, and every value finite.
pub fn check_normwise(what: &str, out: &[f64], reference: &[f64], tol: f64) -> Result<(), String> {
    same_len(what, out, reference)?;
    if let Some(i) = out.iter().position(|o| !o.is_finite()) {
        return Err(format!(
            "`{what}`: element {i} is {} (expected {})",
            out[i], reference[i]
        ));
    }
    let diff: f64 = out
        .iter()
        .zip(reference)
        .map(|(o, r)| (o - r) * (o - r))
        .sum();
    let norm: f64 = reference.iter().map(|r| r * r).sum();
    let err = diff.sqrt() / norm.sqrt().max(TINY);
    if err <= tol {
        Ok(())
    } else {
        Err(format!(
            "`{what}`: normwise error {err:.3e} exceeds {tol:.1e} over {} elements",
            out.len()
        ))
    }
}

/// Bit-for-bit equal values (for results the spec defines as one rounding).
pub fn check_exact(what: &str, out: &[f64], reference: &[f64]) -> Result<(), String> {
    same_len(what, out, reference)?;
    match (0..out.len()).find(|&i| out[i].to_bits() != reference[i].to_bits()) {
        Some(i) => Err(format!(
            "`{what}`: element {i} is {}, expected exactly {}",
            out[i], reference[i]
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_never_passes() {
        assert!(check_close("y", &[1.0, f64::NAN], &[1.0, 0.5], 1.0).is_err());
        assert!(check_normwise("y", &[1.0, f64::NAN], &[1.0, 0.5], 1.0).is_err());
    }

    #[test]
    fn error_is_relative_to_the_largest_value() {
        assert!(check_close("y", &[100.0, 0.01], &[100.0, 0.0], 1e-3).is_ok());
        assert!(check_close("y", &[100.0, 1.0], &[100.0, 0.0], 1e-3).is_err());
    }
}
