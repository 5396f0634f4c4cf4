//! Plans remembered per problem shape.
//!
//! Which kernel runs a GEMM, and how the Hopper launch is cut, split or fused, depend on the
//! device, the sizes, strides, dtypes, epilogue and whether C is read, and on the operands'
//! addresses only through their 16-byte alignment (every router check is `ptr % 16` or
//! coarser). Planning walks tile shapes and a time model (0.4-4 us of host time per call on
//! the development machine, as much as the launch itself), while a model calls the same few
//! shapes again and again: each is planned once and found by a [`PlanKey`] afterwards.

use super::{GemmProblem, MatrixArg};
use calico_core::{Arch, DType, Epilogue};
use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// More distinct shapes than this in one process (a sweep) empties a memo and starts over.
const MAX_PLANS: usize = 4096;

/// Everything a plan may depend on: the problem with each address reduced to its offset from
/// a 16-byte boundary, and the device's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    device: u64,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    in_dtype: DType,
    out_dtype: DType,
    a: OperandKey,
    b: OperandKey,
    c: Option<OperandKey>,
    d: OperandKey,
    bias: Option<u8>,
    reads_c: bool,
    c_is_d: bool,
    epilogue: Epilogue,
}

/// An operand's extents, strides and address modulo 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct OperandKey {
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
    batch_stride: usize,
    align: u8,
}

impl OperandKey {
    fn of(x: &MatrixArg) -> OperandKey {
        OperandKey {
            rows: x.rows,
            cols: x.cols,
            row_stride: x.row_stride,
            col_stride: x.col_stride,
            batch_stride: x.batch_stride,
            align: (x.ptr % 16) as u8,
        }
    }
}

impl PlanKey {
    pub(crate) fn of(arch: &Arch, p: &GemmProblem) -> PlanKey {
        PlanKey {
            device: device_id(arch),
            batch: p.batch,
            m: p.m,
            n: p.n,
            k: p.k,
            in_dtype: p.in_dtype,
            out_dtype: p.out_dtype,
            a: OperandKey::of(&p.a),
            b: OperandKey::of(&p.b),
            c: p.c.as_ref().map(OperandKey::of),
            d: OperandKey::of(&p.d),
            bias: p.bias.map(|b| (b % 16) as u8),
            reads_c: p.beta != 0.0,
            c_is_d: p.c.is_some_and(|c| c.ptr == p.d.ptr),
            epilogue: p.epilogue,
        }
    }
}

/// The device's target and sizes: the router reads nothing else of the [`Arch`] (its matrix
/// instructions and copies follow from the target).
fn device_id(arch: &Arch) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    arch.target.hash(&mut h);
    (arch.compute_units, arch.shared_mem_per_block, arch.l2_bytes).hash(&mut h);
    h.finish()
}

/// Plans of one kind (`T`) by [`PlanKey`], shared by every thread of the process.
pub(crate) struct PlanMemo<T> {
    plans: Mutex<Option<FxHashMap<PlanKey, T>>>,
}

impl<T: Copy> PlanMemo<T> {
    pub(crate) const fn new() -> PlanMemo<T> {
        PlanMemo {
            plans: Mutex::new(None),
        }
    }

    /// The plan remembered for `key`, else `plan()`'s, remembered when it is `Ok` (errors are
    /// rare and cheap to make again, and keep their messages).
    pub(crate) fn get_or_plan<E>(
        &self,
        key: PlanKey,
        plan: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        if let Some(found) = self.lock().as_ref().and_then(|m| m.get(&key).copied()) {
            return Ok(found);
        }
        // Planned outside the lock: other threads' launches need not wait for it.
        let planned = plan()?;
        let mut guard = self.lock();
        let plans = guard.get_or_insert_with(FxHashMap::default);
        if plans.len() >= MAX_PLANS {
            plans.clear();
        }
        plans.insert(key, planned);
        Ok(planned)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<FxHashMap<PlanKey, T>>> {
        // A panic while holding the lock leaves a map of whole entries: keep using it.
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::{h100, problem};
    use calico_core::{DType, Epilogue};

    #[test]
    fn the_key_ignores_addresses_but_not_their_alignment() {
        let arch = h100();
        let p = problem(1000, 1000, 1000, true);
        let mut moved = p;
        moved.a.ptr += 1 << 24;
        moved.d.ptr += 4096;
        assert_eq!(PlanKey::of(&arch, &p), PlanKey::of(&arch, &moved));
        let mut misaligned = p;
        misaligned.b.ptr += 2;
        assert_ne!(PlanKey::of(&arch, &p), PlanKey::of(&arch, &misaligned));
        let mut wider = p;
        wider.n += 1;
        assert_ne!(PlanKey::of(&arch, &p), PlanKey::of(&arch, &wider));
    }

    #[test]
    fn the_key_tells_devices_and_reads_of_c_apart() {
        let p = problem(256, 256, 256, false);
        let a100 = Arch::for_target("sm_80").unwrap();
        assert_ne!(PlanKey::of(&h100(), &p), PlanKey::of(&a100, &p));
        let mut fewer_sms = h100();
        fewer_sms.compute_units = 114;
        assert_ne!(PlanKey::of(&h100(), &p), PlanKey::of(&fewer_sms, &p));
        let mut with_c = p;
        with_c.c = Some(p.d);
        let mut reading_c = with_c;
        reading_c.beta = 1.0;
        assert_ne!(
            PlanKey::of(&h100(), &with_c),
            PlanKey::of(&h100(), &reading_c)
        );
        let mut separate_c = reading_c;
        separate_c.c = Some(MatrixArg {
            ptr: p.d.ptr + (1 << 20),
            ..p.d
        });
        assert_ne!(
            PlanKey::of(&h100(), &reading_c),
            PlanKey::of(&h100(), &separate_c)
        );
    }

    /// A problem of random sizes, layouts, optional parts and pointer offsets (`rng`: a
    /// 64-bit LCG state).
    fn random_problem(rng: &mut u64) -> GemmProblem {
        let mut next = |n: u64| {
            *rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*rng >> 33) % n) as usize
        };
        const SIZES: [usize; 14] = [
            1, 7, 16, 64, 65, 129, 300, 777, 1000, 1500, 3072, 4095, 4096, 14336,
        ];
        let (m, n, k) = (SIZES[next(14)], SIZES[next(14)], SIZES[next(14)]);
        let mut p = problem(m, n, k, next(2) == 0);
        let pad = [0, 0, 8, 3, 64][next(5)];
        p.a.row_stride += pad;
        p.a.batch_stride = p.a.row_stride * m;
        p.batch = [1, 1, 3][next(3)];
        p.out_dtype = [DType::BF16, DType::F16, DType::F32][next(3)];
        if next(3) == 0 {
            p.c = Some(MatrixArg {
                ptr: if next(2) == 0 { p.d.ptr } else { 5 << 20 },
                ..p.d
            });
            p.beta = [0.0, 1.0][next(2)];
        }
        if next(2) == 0 {
            p.bias = Some(6 << 20);
        }
        p.epilogue = [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][next(3)];
        for ptr in [&mut p.a.ptr, &mut p.b.ptr, &mut p.d.ptr] {
            *ptr += [0, 0, 0, 2, 8][next(5)] as u64;
        }
        p
    }

    /// `p` with every buffer moved by a multiple of 16 bytes: the same [`PlanKey`].
    fn moved(p: &GemmProblem, by: u64) -> GemmProblem {
        let mut q = *p;
        for ptr in [&mut q.a.ptr, &mut q.b.ptr, &mut q.d.ptr] {
            *ptr += by;
        }
        if let Some(c) = q.c.as_mut() {
            c.ptr += by;
        }
        q.bias = q.bias.map(|b| b + by);
        q
    }

    #[test]
    fn problems_of_one_key_get_one_plan() {
        // What the memos assume: the planners read nothing of a problem that its key leaves
        // out. Checked on the router and the Hopper launch plan, for GPUs of both vendors.
        let archs = [
            h100(),
            Arch::for_target("sm_80").unwrap(),
            Arch::for_target("gfx942").unwrap(),
        ];
        let tune = crate::gemm::hopper::Tune::default();
        let mut rng = 17;
        let mut hopper_plans = 0;
        for _ in 0..2000 {
            let p = random_problem(&mut rng);
            let q = moved(&p, (16 * 977) << 10);
            for arch in &archs {
                assert_eq!(PlanKey::of(arch, &p), PlanKey::of(arch, &q));
                let route = crate::gemm::route_unremembered(arch, &p);
                assert_eq!(
                    route.as_ref().ok(),
                    crate::gemm::route_unremembered(arch, &q).as_ref().ok()
                );
                if route.ok() == Some(crate::gemm::GemmKernel::Hopper) {
                    hopper_plans += 1;
                    let plan = crate::gemm::hopper::plan_launch(arch, &p, tune).ok();
                    assert!(plan.is_some(), "{p:?}");
                    assert_eq!(
                        plan,
                        crate::gemm::hopper::plan_launch(arch, &q, tune).ok(),
                        "{p:?}"
                    );
                }
            }
        }
        assert!(
            hopper_plans > 150,
            "only {hopper_plans} problems reached the Hopper planner"
        );
    }

    #[test]
    fn a_memo_plans_each_key_once_and_keeps_no_errors() {
        let memo = PlanMemo::<usize>::new();
        let key = PlanKey::of(&h100(), &problem(64, 64, 64, true));
        let mut calls = 0;
        for _ in 0..3 {
            let got: Result<usize, ()> = memo.get_or_plan(key, || {
                calls += 1;
                Ok(7)
            });
            assert_eq!(got, Ok(7));
        }
        assert_eq!(calls, 1);
        let other = PlanKey::of(&h100(), &problem(64, 64, 128, true));
        let failed: Result<usize, &str> = memo.get_or_plan(other, || Err("no kernel"));
        assert_eq!(failed, Err("no kernel"));
        let retried: Result<usize, &str> = memo.get_or_plan(other, || Ok(3));
        assert_eq!(retried, Ok(3));
    }
}
