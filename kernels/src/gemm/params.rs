//! The host/device contract of the CUDA GEMM kernels: one `#[repr(C)]` parameter struct per
//! kernel family, passed by value as a single kernel argument ([`KernelArg::Params`]) and
//! mirrored by a device struct in `kernels/device/gemm/params.cuh`.
//!
//! The layout is written down once, here: every variant's source gets `PREFIX_BYTES` (the
//! struct's size), `PREFIX_OFFSETS` (each field's offset, in order) and `PREFIX_NAMES` (the
//! field names, in order) as defines, and the kernel turns them into `static_assert`s
//! (`CALICO_CHECK_PARAMS`), so a field added, moved, renamed or retyped on one side only is a
//! compile error, never a kernel reading the wrong bytes.

use calico_core::{KernelArg, KernelParams, ParamBlock};

/// Declares a parameter struct: `#[repr(C)]`, no padding (checked at compile time: the size
/// is the sum of the field sizes), [`KernelParams`], and its layout defines.
macro_rules! kernel_params {
    ($(#[$meta:meta])* $name:ident, $prefix:literal { $($(#[$fmeta:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Default)]
        pub(crate) struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        const _: () = assert!(
            std::mem::size_of::<$name>() == 0 $(+ std::mem::size_of::<$ty>())*,
            concat!(stringify!($name), " has padding bytes")
        );

        // SAFETY: #[repr(C)], fields are integers and floats only, and the assertion above
        // proves there is no padding: every byte of a value is initialised.
        unsafe impl KernelParams for $name {}

        impl $name {
            /// The define prefix of this struct's layout constants.
            #[allow(dead_code)]
            pub(crate) const PREFIX: &'static str = $prefix;

            /// `PREFIX_BYTES` (the size), `PREFIX_OFFSETS` (every field's offset, in order)
            /// and `PREFIX_NAMES` (the field names, in order) for the kernel's static_asserts.
            pub(crate) fn layout_defines() -> Vec<(&'static str, String)> {
                let offsets: &[usize] = &[$(std::mem::offset_of!($name, $field)),*];
                let offsets: Vec<String> = offsets.iter().map(|o| o.to_string()).collect();
                vec![
                    (concat!($prefix, "_BYTES"), std::mem::size_of::<$name>().to_string()),
                    (concat!($prefix, "_OFFSETS"), offsets.join(", ")),
                    (concat!($prefix, "_NAMES"), concat!("\"", $(stringify!($field), ",",)* "\"").to_string()),
                ]
            }

            /// The value as one kernel argument.
            pub(crate) fn arg(&self) -> KernelArg {
                KernelArg::Params(ParamBlock::new(self))
            }
        }
    };
}

kernel_params! {
    /// `calico_gemm_hopper` (hopper.cu), after its three tensor maps. Strides in elements.
    HopperParams, "CALICO_HOPPER_PARAMS" {
        d: u64,
        /// Read only with CALICO_GEMM_HAS_C; may equal `d`.
        c: u64,
        /// N elements, read only with CALICO_GEMM_HAS_BIAS.
        bias: u64,
        d_row_stride: i64,
        d_batch_stride: i64,
        c_row_stride: i64,
        c_batch_stride: i64,
        m: i32,
        n: i32,
        k: i32,
        batch: i32,
        /// 1, or 0 to broadcast A (B) over the batch.
        a_batch_step: i32,
        b_batch_step: i32,
        /// Row tiles that sweep all column tiles together.
        group_m: i32,
        alpha: f32,
        beta: f32,
        /// Split-K variants (CALICO_GEMM_SPLIT_K): copies of the tile list, each over its own
        /// range of k-tiles (0 or 1 otherwise). Also keeps the struct free of padding.
        k_splits: i32,
        /// Fused split-K variants (CALICO_GEMM_SPLIT_FUSED): one f32 slot of partial sums per
        /// work item (workspace) and one counter per tile (zeroed counters); 0 otherwise.
        split_partials: u64,
        split_counters: u64,
    }
}

kernel_params! {
    /// `calico_gemm_sm80` (sm80.cu): every operand as pointer and row / column / batch strides
    /// in elements (a_cs must be 1; b_rs or b_cs 1), batches z, z + grid_z, ... per block.
    Sm80Params, "CALICO_SM80_PARAMS" {
        a: u64,
        a_rs: i64,
        a_cs: i64,
        a_bs: i64,
        b: u64,
        b_rs: i64,
        b_cs: i64,
        b_bs: i64,
        c: u64,
        c_rs: i64,
        c_cs: i64,
        c_bs: i64,
        d: u64,
        d_rs: i64,
        d_cs: i64,
        d_bs: i64,
        bias: u64,
        m: i64,
        n: i64,
        k: i64,
        batch: i64,
        grid_z: i64,
        alpha: f32,
        beta: f32,
    }
}

kernel_params! {
    /// The kernels against a K-major weight W (N x K, K contiguous): `calico_gemm_skinny`
    /// (skinny.cu; the GEMV takes the same values positionally, see gemv.cu). Strides in elements.
    WeightParams, "CALICO_WEIGHT_PARAMS" {
        a: u64,
        a_rs: i64,
        w: u64,
        w_rs: i64,
        c: u64,
        c_rs: i64,
        c_cs: i64,
        d: u64,
        d_rs: i64,
        d_cs: i64,
        bias: u64,
        m: i64,
        n: i64,
        k: i64,
        alpha: f32,
        beta: f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use calico_core::{KernelSource, PARAM_BLOCK_BYTES};

    #[test]
    fn structs_fit_a_param_block_and_keep_their_bytes() {
        assert!(std::mem::size_of::<Sm80Params>() <= PARAM_BLOCK_BYTES);
        let p = HopperParams {
            d: 0x1122_3344_5566_7788,
            m: 7,
            alpha: 0.5,
            ..Default::default()
        };
        let KernelArg::Params(block) = p.arg() else {
            panic!("not a Params argument");
        };
        let bytes = block.as_bytes();
        assert_eq!(bytes.len(), std::mem::size_of::<HopperParams>());
        assert_eq!(&bytes[..8], &0x1122_3344_5566_7788u64.to_ne_bytes());
        let at_m = std::mem::offset_of!(HopperParams, m);
        assert_eq!(&bytes[at_m..at_m + 4], &7i32.to_ne_bytes());
        let at_alpha = std::mem::offset_of!(HopperParams, alpha);
        assert_eq!(&bytes[at_alpha..at_alpha + 4], &0.5f32.to_ne_bytes());
    }

    #[test]
    fn layout_defines_list_every_field_in_order() {
        let defines = HopperParams::layout_defines();
        assert_eq!(
            defines[0],
            ("CALICO_HOPPER_PARAMS_BYTES", "112".to_string())
        );
        assert_eq!(
            defines[1].1,
            "0, 8, 16, 24, 32, 40, 48, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92, 96, 104"
        );
        assert!(defines[2].1.starts_with("\"d,c,bias,d_row_stride,"));
        assert!(defines[2]
            .1
            .ends_with(",alpha,beta,k_splits,split_partials,split_counters,\""));
        assert_eq!(Sm80Params::layout_defines()[0].1, "184");
        assert_eq!(WeightParams::layout_defines()[0].1, "120");
    }

    /// The device mirrors (params.cuh) against the host's layout defines, compiled by NVRTC:
    /// the real defines compile, and a define that disagrees with the device struct is
    /// refused by its static_assert (so the check is live). Skipped without NVRTC.
    #[test]
    fn device_structs_match_the_host_layout() {
        if calico_cuda::probe::require_nvrtc().is_err()
            || calico_cuda::nvrtc::include_dirs().is_empty()
        {
            println!("skipped: NVRTC or the CUDA headers are not installed");
            return;
        }
        let body = r#"
#include "calico/calico.h"
#include "gemm/params.cuh"
typedef calico::gemm::hopper_params<bf16> hopper_t;
typedef calico::gemm::sm80_params<bf16, float> sm80_t;
typedef calico::gemm::weight_params<f16, bf16> weight_t;
CALICO_CHECK_PARAMS(CALICO_HOPPER_FIELDS, bf16, bf16, CALICO_HOPPER_PARAMS, hopper_t);
CALICO_CHECK_PARAMS(CALICO_SM80_FIELDS, bf16, float, CALICO_SM80_PARAMS, sm80_t);
CALICO_CHECK_PARAMS(CALICO_WEIGHT_FIELDS, f16, bf16, CALICO_WEIGHT_PARAMS, weight_t);
CALICO_KERNEL void params_probe(const hopper_t h, const sm80_t s, const weight_t w, float* out) {
    out[0] = h.alpha + s.beta + w.alpha;
}
"#;
        let mut defines = HopperParams::layout_defines();
        defines.extend(Sm80Params::layout_defines());
        defines.extend(WeightParams::layout_defines());
        let sets = [
            calico_cuda::device_headers(),
            calico_core::device_headers(),
            super::super::portable::GEMM_HEADERS,
        ];
        let compile = |defines: &[(&'static str, String)]| {
            let src = KernelSource::assemble("params_probe", body, &sets, defines).unwrap();
            calico_cuda::nvrtc::compile(&src, "sm_90a")
        };
        compile(&defines).expect("the device structs match the host's layout");
        // A field moved on the host (offsets), renamed or reordered (names), or a struct that
        // grew: each is refused by the device's static_asserts.
        let broken = |key: &str, edit: &dyn Fn(&str) -> String, message: &str| {
            let mut wrong = defines.clone();
            let at = wrong.iter().position(|(k, _)| *k == key).unwrap();
            wrong[at].1 = edit(&wrong[at].1);
            let err = compile(&wrong).expect_err(key).to_string();
            assert!(err.contains(message), "{key}: {err}");
        };
        broken(
            "CALICO_SM80_PARAMS_OFFSETS",
            &|v| v.replacen("128, ", "120, ", 1),
            "field offsets differ",
        );
        broken(
            "CALICO_WEIGHT_PARAMS_NAMES",
            &|v| v.replace("c_rs,c_cs", "c_cs,c_rs"),
            "field names or order differ",
        );
        broken(
            "CALICO_HOPPER_PARAMS_BYTES",
            &|_| "104".into(),
            "size differs",
        );
    }
}
