//! The architecture descriptor: what a device can do, so kernels can pick variants and tile sizes.

use crate::DType;
use std::fmt;

/// Who made the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    Nvidia,
    Amd,
    Cpu,
}

/// The family of matrix instruction an [`MmaAtom`] belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MmaKind {
    /// Warp-level `mma.sync` (sm_80+).
    MmaSync,
    /// Warpgroup-level asynchronous `wgmma` (sm_90a); `n` ranges over multiples of 8 up to 256.
    Wgmma,
    /// CDNA matrix-fused-multiply-add (`v_mfma_*`), one wavefront of 64 lanes.
    Mfma,
}

/// One matrix-multiply instruction shape: D[m x n] (acc) += A[m x k] (a) * B[k x n] (b).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmaAtom {
    pub kind: MmaKind,
    pub a: DType,
    pub b: DType,
    pub acc: DType,
    pub m: u32,
    pub n: u32,
    pub k: u32,
}

/// Ways a device can copy global memory to shared memory without staging through registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncCopy {
    /// Hopper's tensor memory accelerator (`cp.async.bulk.tensor`), completing on an mbarrier.
    Tma,
    /// Ampere's `cp.async` (4, 8 or 16 bytes per thread).
    CpAsync,
    /// CDNA buffer loads into registers (`buffer_load_dwordx4`), with hardware bounds checks.
    BufferLoad,
    /// CDNA buffer loads straight into LDS (`buffer_load ... lds`).
    BufferLoadToLds,
}

/// The fp8 encoding a device implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Flavour {
    /// OCP fp8 (e4m3fn / e5m2), NVIDIA sm_89+ and CDNA4.
    Ocp,
    /// "Finite, no negative zero" fp8 with a bias shifted by one, CDNA3.
    Fnuz,
}

/// What a device is: vendor, compile target, warp width, sizes and matrix/async-copy features.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arch {
    pub vendor: Vendor,
    /// The compiler target: `sm_90a`, `sm_80`, `gfx942`, or the CPU's architecture name.
    pub target: String,
    /// Lanes per warp (32) or wavefront (64); 1 on the CPU.
    pub lanes: u32,
    /// Streaming multiprocessors, compute units, or CPU threads.
    pub compute_units: u32,
    /// Largest shared memory (LDS) one block may use, in bytes, after opting in.
    pub shared_mem_per_block: usize,
    /// Last-level cache size in bytes (0 if unknown).
    pub l2_bytes: usize,
    /// The matrix instructions kernels may use.
    pub mma: Vec<MmaAtom>,
    /// The asynchronous global-to-shared copies kernels may use.
    pub async_copies: Vec<AsyncCopy>,
    /// The fp8 flavour, if the matrix units take fp8.
    pub fp8: Option<Fp8Flavour>,
}

const fn atom(kind: MmaKind, a: DType, acc: DType, m: u32, n: u32, k: u32) -> MmaAtom {
    MmaAtom {
        kind,
        a,
        b: a,
        acc,
        m,
        n,
        k,
    }
}

impl Arch {
    /// An NVIDIA GPU of compute capability `major.minor`. Hopper (9.0) targets `sm_90a` so that
    /// wgmma and setmaxnreg are available.
    pub fn nvidia(
        major: u32,
        minor: u32,
        sms: u32,
        shared_mem_per_block: usize,
        l2_bytes: usize,
    ) -> Arch {
        let target = if major == 9 && minor == 0 {
            "sm_90a".to_string()
        } else {
            format!("sm_{major}{minor}")
        };
        let mut mma = Vec::new();
        let mut async_copies = Vec::new();
        let mut fp8 = None;
        if major >= 8 {
            for t in [DType::BF16, DType::F16] {
                mma.push(atom(MmaKind::MmaSync, t, DType::F32, 16, 8, 16));
            }
            async_copies.push(AsyncCopy::CpAsync);
        }
        if (major, minor) >= (8, 9) {
            fp8 = Some(Fp8Flavour::Ocp);
            for t in [DType::F8E4M3, DType::F8E5M2] {
                mma.push(atom(MmaKind::MmaSync, t, DType::F32, 16, 8, 32));
            }
        }
        if major == 9 {
            for t in [DType::BF16, DType::F16] {
                mma.push(atom(MmaKind::Wgmma, t, DType::F32, 64, 256, 16));
            }
            for t in [DType::F8E4M3, DType::F8E5M2] {
                mma.push(atom(MmaKind::Wgmma, t, DType::F32, 64, 256, 32));
            }
        }
        // The tensor memory accelerator (and thread-block clusters) from sm_90 on; wgmma is
        // sm_90's alone (Blackwell's tcgen05 MMA is not listed: no kernel uses it yet).
        if major >= 9 {
            async_copies.push(AsyncCopy::Tma);
        }
        Arch {
            vendor: Vendor::Nvidia,
            target,
            lanes: 32,
            compute_units: sms,
            shared_mem_per_block,
            l2_bytes,
            mma,
            async_copies,
            fp8,
        }
    }

    /// An AMD GPU named by its gcn arch (`gfx942`, `gfx90a`, ...; feature suffixes such as
    /// `:sramecc+:xnack-` are dropped from the target).
    pub fn amd(
        gcn_arch: &str,
        cus: u32,
        lds_bytes: usize,
        wavefront: u32,
        l2_bytes: usize,
    ) -> Arch {
        let target = gcn_arch.split(':').next().unwrap_or(gcn_arch).to_string();
        let cdna3 = target.starts_with("gfx94");
        let cdna4 = target.starts_with("gfx95");
        let cdna = target.starts_with("gfx90a") || cdna3 || cdna4;
        let mut mma = Vec::new();
        let mut async_copies = vec![AsyncCopy::BufferLoad];
        let mut fp8 = None;
        if cdna {
            for t in [DType::BF16, DType::F16] {
                mma.push(atom(MmaKind::Mfma, t, DType::F32, 16, 16, 16));
                mma.push(atom(MmaKind::Mfma, t, DType::F32, 32, 32, 8));
            }
            async_copies.push(AsyncCopy::BufferLoadToLds);
        }
        if cdna3 || cdna4 {
            fp8 = Some(if cdna4 {
                Fp8Flavour::Ocp
            } else {
                Fp8Flavour::Fnuz
            });
            for t in [DType::F8E4M3, DType::F8E5M2] {
                mma.push(atom(MmaKind::Mfma, t, DType::F32, 16, 16, 32));
            }
        }
        Arch {
            vendor: Vendor::Amd,
            target,
            lanes: wavefront,
            compute_units: cus,
            shared_mem_per_block: lds_bytes,
            l2_bytes,
            mma,
            async_copies,
            fp8,
        }
    }

    /// The host CPU with `threads` worker threads.
    pub fn cpu(threads: u32) -> Arch {
        Arch {
            vendor: Vendor::Cpu,
            target: std::env::consts::ARCH.to_string(),
            lanes: 1,
            compute_units: threads,
            shared_mem_per_block: 0,
            l2_bytes: 0,
            mma: Vec::new(),
            async_copies: Vec::new(),
            fp8: None,
        }
    }

    /// A descriptor for a compile target alone (no device), with typical sizes; used to compile
    /// and disassemble for targets that are not present. Accepts `sm_XY[a]` and `gfxNNN`.
    pub fn for_target(target: &str) -> Option<Arch> {
        if let Some(rest) = target.strip_prefix("sm_") {
            let digits = rest.trim_end_matches('a');
            let n: u32 = digits.parse().ok()?;
            let (major, minor) = (n / 10, n % 10);
            let (sms, smem, l2) = match major {
                // B200 (sm_100): 148 SMs, 227 KiB per block, 126 MB of L2.
                10 => (148, 227 * 1024, 126 << 20),
                9 => (132, 227 * 1024, 50 << 20),
                8 => (108, 163 * 1024, 40 << 20),
                _ => (80, 96 * 1024, 6 << 20),
            };
            let mut arch = Arch::nvidia(major, minor, sms, smem, l2);
            arch.target = target.to_string();
            return Some(arch);
        }
        if target.starts_with("gfx") {
            let (cus, l2) = if target.starts_with("gfx94") {
                (304, 4 << 20)
            } else {
                (110, 8 << 20)
            };
            return Some(Arch::amd(target, cus, 64 * 1024, 64, l2));
        }
        None
    }

    /// True when the device has a matrix atom of `kind` for inputs of `dtype`.
    pub fn has_mma(&self, kind: MmaKind, dtype: DType) -> bool {
        self.mma.iter().any(|a| a.kind == kind && a.a == dtype)
    }

    /// True when the device has the given async-copy kind.
    pub fn has_async_copy(&self, kind: AsyncCopy) -> bool {
        self.async_copies.contains(&kind)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} {} ({} lanes, {} compute units, {} KiB shared/block, {} MiB L2)",
            self.vendor,
            self.target,
            self.lanes,
            self.compute_units,
            self.shared_mem_per_block / 1024,
            self.l2_bytes >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hopper_gets_sm90a_wgmma_and_tma() {
        let a = Arch::nvidia(9, 0, 132, 227 * 1024, 50 << 20);
        assert_eq!(a.target, "sm_90a");
        assert!(a.has_mma(MmaKind::Wgmma, DType::BF16));
        assert!(a.has_async_copy(AsyncCopy::Tma));
        assert_eq!(a.fp8, Some(Fp8Flavour::Ocp));
    }

    #[test]
    fn blackwell_has_tma_but_no_wgmma() {
        for target in ["sm_100", "sm_100a"] {
            let a = Arch::for_target(target).unwrap();
            assert!(a.has_async_copy(AsyncCopy::Tma), "{target}");
            assert!(a.has_mma(MmaKind::MmaSync, DType::BF16), "{target}");
            assert!(!a.has_mma(MmaKind::Wgmma, DType::BF16), "{target}");
        }
        assert!(!Arch::for_target("sm_80")
            .unwrap()
            .has_async_copy(AsyncCopy::Tma));
    }

    #[test]
    fn ampere_has_no_wgmma() {
        let a = Arch::nvidia(8, 0, 108, 163 * 1024, 40 << 20);
        assert_eq!(a.target, "sm_80");
        assert!(a.has_mma(MmaKind::MmaSync, DType::BF16));
        assert!(!a.has_mma(MmaKind::Wgmma, DType::BF16));
        assert_eq!(a.fp8, None);
    }

    #[test]
    fn cdna3_is_wave64_with_fnuz_fp8() {
        let a = Arch::amd("gfx942:sramecc+:xnack-", 304, 65536, 64, 4 << 20);
        assert_eq!(a.target, "gfx942");
        assert_eq!(a.lanes, 64);
        assert_eq!(a.fp8, Some(Fp8Flavour::Fnuz));
        assert!(a.has_mma(MmaKind::Mfma, DType::BF16));
    }

    #[test]
    fn targets_parse() {
        assert_eq!(Arch::for_target("sm_90a").unwrap().target, "sm_90a");
        assert_eq!(Arch::for_target("sm_80").unwrap().lanes, 32);
        assert_eq!(Arch::for_target("gfx90a").unwrap().lanes, 64);
        assert!(Arch::for_target("x86").is_none());
    }
}
