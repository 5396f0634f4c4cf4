//! The element-wise function a GEMM applies to its output, shared by every backend.

/// The activation applied after `alpha * A @ B + beta * C + bias`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Epilogue {
    #[default]
    None,
    /// GELU, exact erf form: `0.5 * x * (1 + erf(x / sqrt(2)))`.
    Gelu,
    /// SiLU: `x / (1 + exp(-x))`.
    Silu,
}

impl Epilogue {
    /// The value of the `CALICO_GEMM_EPILOGUE` define in the device kernels.
    pub fn define(self) -> &'static str {
        match self {
            Epilogue::None => "0",
            Epilogue::Gelu => "1",
            Epilogue::Silu => "2",
        }
    }
}
