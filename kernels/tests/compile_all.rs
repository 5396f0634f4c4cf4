//! Compiles every kernel variant for sm_80, sm_90a (NVRTC) and gfx90a, gfx942 (clang), and the
//! sm_100a variants that differ from sm_80's, with no GPU. A missing toolchain is reported as
//! skipped, except under CI=true, where it fails.

use calico::catalog;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skips (or, in CI, fails) when `available` is an error.
fn toolchain_or_skip(what: &str, available: Result<(), String>) -> bool {
    match available {
        Ok(()) => true,
        Err(why) if in_ci() => panic!("{what}: toolchain missing in CI: {why}"),
        Err(why) => {
            println!("skipped: {what}: {why}");
            false
        }
    }
}

/// sm_80, sm_90a, gfx90a and gfx942, less those whose compiler is missing here (said once per
/// toolchain; a missing toolchain fails under CI).
fn four_targets() -> Vec<&'static str> {
    let nvidia = toolchain_or_skip("sm_80/sm_90a", nvrtc_available());
    let amd = toolchain_or_skip("gfx90a/gfx942", clang_available());
    [
        ("sm_80", nvidia),
        ("sm_90a", nvidia),
        ("gfx90a", amd),
        ("gfx942", amd),
    ]
    .into_iter()
    .filter_map(|(target, available)| available.then_some(target))
    .collect()
}

fn nvrtc_available() -> Result<(), String> {
    calico_cuda::probe::require_nvrtc().map_err(|e| format!("nvrtc not found ({e})"))?;
    if calico_cuda::nvrtc::include_dirs().is_empty() {
        return Err("CUDA headers not found (set CUDA_HOME)".into());
    }
    Ok(())
}

fn clang_available() -> Result<(), String> {
    calico_hip::require_clang().map_err(|e| e.to_string())
}

/// The catalog's variants for `target`; CALICO_COMPILE_OP=<op> keeps one op's only (a quick
/// local check).
fn catalog_entries(target: &str) -> Vec<catalog::CatalogEntry> {
    let op = std::env::var("CALICO_COMPILE_OP").ok();
    let entries = catalog::entries(target, op.as_deref()).expect("catalog assembles");
    assert!(!entries.is_empty(), "{target}: empty catalog");
    entries
}

/// Compiles `entries` for `target` and returns each with its binary; fails listing every
/// variant that did not compile.
fn compile_entries(
    target: &str,
    entries: Vec<catalog::CatalogEntry>,
) -> Vec<(catalog::CatalogEntry, Vec<u8>)> {
    let mut compiled = Vec::with_capacity(entries.len());
    let mut failures = Vec::new();
    for e in entries {
        match catalog::compile(target, &e.source) {
            Ok(binary) => compiled.push((e, binary)),
            Err(err) => failures.push(format!("{} [{}]: {err}", e.op, e.label)),
        }
    }
    println!(
        "{target}: {} variants compiled, {} failed",
        compiled.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{target}:\n{}", failures.join("\n\n"));
    compiled
}

/// `entries` compiled for the NVIDIA `target` (failing as compile_entries does), each with its
/// SASS; `None` after reporting the disassembler missing (skipped, or a failure under CI=true).
fn nvidia_sass(
    target: &str,
    entries: Vec<catalog::CatalogEntry>,
) -> Option<Vec<(catalog::CatalogEntry, String)>> {
    let mut out = Vec::new();
    for (e, cubin) in compile_entries(target, entries) {
        match catalog::disassemble(target, &cubin) {
            Ok(sass) => out.push((e, sass)),
            Err(err) => {
                toolchain_or_skip("cuobjdump", Err(err.to_string()));
                return None;
            }
        }
    }
    Some(out)
}

/// An AMD catalog variant compiled for `target`: its disassembly and the resources of the
/// kernels in its code object.
fn compile_amd(target: &str, e: &catalog::CatalogEntry) -> (String, Vec<catalog::KernelResources>) {
    let code = catalog::compile(target, &e.source).expect("compiles");
    let asm = catalog::disassemble(target, &code).expect("disassembles");
    let kernels = catalog::resources(target, &code)
        .expect("metadata")
        .expect("AMD");
    (asm, kernels)
}

/// No scratch (spills) and at least `min_waves` waves per SIMD.
fn assert_fits(what: &str, k: &catalog::KernelResources, min_waves: u32) {
    assert!(!k.uses_scratch(), "{what}: scratch: {}", k.summary());
    assert!(k.occupancy() >= min_waves, "{what}: {}", k.summary());
}

fn compile_target(target: &str) {
    compile_entries(target, catalog_entries(target));
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90a() {
    if toolchain_or_skip("sm_80/sm_90a", nvrtc_available()) {
        compile_target("sm_80");
        compile_target("sm_90a");
    }
}

/// Every kernel Calico would launch on a B200 (the sm_100a catalog) compiles with NVRTC for
/// sm_100a, and none holds wgmma (HGMMA), which Blackwell lacks: the Hopper GEMM and attention
/// stay out of its catalog, as the router sends sm_100 to the mma.sync kernels (gemm/plan.rs).
/// Its GEMM (the sm80 kernel with a TMA producer, `sm80-tma` variants) issues TMA loads
/// (UTMALDG) and mma.sync (HMMA) with ldmatrix (LDSM) and no local memory (LDL/STL: spills).
///
/// Compiling all of it took about 110 s here, so only the variants whose source differs from
/// every sm_80 variant are compiled and disassembled: a source identical to an sm_80 one
/// compiles for sm_80 (the test above) and has no `__CUDA_ARCH__` branches (no device source
/// has), so it holds neither wgmma nor TMA. The TMA tile paths' UTMALDG on sm_100a is also
/// checked in conformance/tests/tiles.rs. Any UTMALDG found here is printed.
#[test]
fn sm100a_catalog_compiles_without_hgmma() {
    if !toolchain_or_skip("sm_100a", nvrtc_available()) {
        return;
    }
    let sm80: std::collections::HashSet<_> = catalog_entries("sm_80")
        .into_iter()
        .map(|e| e.source.digest)
        .collect();
    let mut per_op = std::collections::BTreeMap::<&str, usize>::new();
    let mut own = Vec::new();
    for e in catalog_entries("sm_100a") {
        *per_op.entry(e.op).or_default() += 1;
        if !sm80.contains(&e.source.digest) {
            own.push(e);
        }
    }
    println!("sm_100a catalog per op: {per_op:?}");
    // The router sends sm_100 to the mma.sync / cp.async kernels: no Hopper-only variant may
    // be listed, and the catalog must not be empty (else nothing here was checked).
    assert!(per_op.contains_key("gemm") && per_op.contains_key("attention"));
    let hopper_only: Vec<_> = catalog_entries("sm_100a")
        .into_iter()
        .filter(|e| e.op == "attention_hopper" || e.label.starts_with("hopper"))
        .map(|e| format!("{} [{}]", e.op, e.label))
        .collect();
    assert!(
        hopper_only.is_empty(),
        "Hopper-only variants in the sm_100a catalog: {hopper_only:?}"
    );
    let mut hgmma_kernels = Vec::new();
    let mut tma_gemms = 0;
    let Some(compiled) = nvidia_sass("sm_100a", own) else {
        return;
    };
    for (e, sass) in compiled {
        let hgmma = calico_cuda::disasm::count_opcode(&sass, "HGMMA");
        let utmaldg = calico_cuda::disasm::count_opcode(&sass, "UTMALDG");
        println!("{} [{}]: {hgmma} HGMMA, {utmaldg} UTMALDG", e.op, e.label);
        if hgmma > 0 {
            hgmma_kernels.push(format!("{} [{}]: {hgmma} HGMMA", e.op, e.label));
        }
        if e.op == "gemm" && e.label.starts_with("sm80-tma") {
            assert_tma_mma_sync(&e.label, &sass);
            tma_gemms += 1;
        }
    }
    assert!(
        hgmma_kernels.is_empty(),
        "wgmma kernels in the sm_100a catalog:\n{}",
        hgmma_kernels.join("\n")
    );
    if std::env::var("CALICO_COMPILE_OP").is_err() {
        assert!(tma_gemms > 0, "no sm80-tma GEMM in the sm_100a catalog");
    }
}

/// The TMA + mma.sync GEMM's SASS: TMA loads, mma.sync fed by ldmatrix, no wgmma, and no
/// local memory (spilled registers would show as LDL/STL).
fn assert_tma_mma_sync(label: &str, sass: &str) {
    let count = |op: &str| calico_cuda::disasm::count_opcode(sass, op);
    let (utmaldg, hmma, ldsm) = (count("UTMALDG"), count("HMMA"), count("LDSM"));
    println!("{label}: {utmaldg} UTMALDG, {hmma} HMMA, {ldsm} LDSM");
    assert!(
        utmaldg > 0 && hmma > 0 && ldsm > 0,
        "{label}: {utmaldg} UTMALDG, {hmma} HMMA, {ldsm} LDSM"
    );
    assert_eq!(count("HGMMA"), 0, "{label}: wgmma");
    assert_eq!(
        count("LDL") + count("STL"),
        0,
        "{label}: local memory (spills)"
    );
}

/// The TMA + mma.sync GEMM also compiles for sm_90a (where `CALICO_GEMM_ROUTE_AS=sm_100a` runs
/// it on an H100) with the same instructions.
#[test]
fn tma_mma_sync_gemm_disassembles_to_utmaldg_and_hmma_on_sm90a() {
    if !toolchain_or_skip("sm_90a", nvrtc_available()) {
        return;
    }
    let entries: Vec<_> = catalog::entries("sm_90a", Some("gemm"))
        .expect("catalog assembles")
        .into_iter()
        .filter(|e| e.label.starts_with("sm80-tma"))
        .collect();
    assert!(
        !entries.is_empty(),
        "no sm80-tma GEMM in the sm_90a catalog"
    );
    for (e, sass) in nvidia_sass("sm_90a", entries).unwrap_or_default() {
        assert_tma_mma_sync(&e.label, &sass);
    }
}

#[test]
fn every_kernel_compiles_for_gfx90a_and_gfx942() {
    if toolchain_or_skip("gfx90a/gfx942", clang_available()) {
        compile_target("gfx90a");
        compile_target("gfx942");
    }
}

/// The Hopper GEMM is what it claims to be: wgmma (HGMMA) fed by the tensor memory
/// accelerator (UTMALDG), as `calico compile --op gemm --target sm_90a --disasm` shows a user.
#[test]
fn hopper_gemm_disassembles_to_hgmma_and_utmaldg() {
    if !toolchain_or_skip("sm_90a disassembly", nvrtc_available()) {
        return;
    }
    let entries: Vec<_> = catalog::entries("sm_90a", Some("gemm"))
        .expect("catalog assembles")
        .into_iter()
        .filter(|e| e.label.starts_with("hopper"))
        .collect();
    assert!(
        !entries.is_empty(),
        "the sm_90a catalog has Hopper GEMM variants"
    );
    assert_hgmma_fed_by_tma(entries);
}

/// The Hopper attention kernels (forward and the backward's main kernel) are wgmma (HGMMA)
/// fed by TMA (UTMALDG).
#[test]
fn hopper_attention_disassembles_to_hgmma_and_utmaldg() {
    if !toolchain_or_skip("sm_90a disassembly", nvrtc_available()) {
        return;
    }
    let entries: Vec<_> = catalog::entries("sm_90a", Some("attention_hopper"))
        .expect("catalog assembles")
        .into_iter()
        .filter(|e| e.label.starts_with("hopper fwd") || e.label.contains("Main"))
        .collect();
    assert!(
        entries.iter().any(|e| e.label.starts_with("hopper bwd")),
        "the sm_90a catalog has Hopper attention backward variants"
    );
    assert_hgmma_fed_by_tma(entries);
}

/// The Hopper backward's head-split main kernels (CALICO_ATTN_HEAD_SPLIT: a unit's query heads
/// over several CTAs, dK and dV stored as f32 partials for the combine kernel) keep the step
/// loop of the kernel they split: no more local memory (LDL/STL) in the innermost loop around
/// their wgmma than the unsplit variant of the same label (some d = 128 ones keep a few loads
/// of loop state there today), and no local memory at all in the combine kernels.
#[test]
fn hopper_attention_backward_head_split_keeps_the_step_loop() {
    if !toolchain_or_skip("sm_90a disassembly", nvrtc_available()) {
        return;
    }
    let all = catalog::entries("sm_90a", Some("attention_hopper")).expect("catalog assembles");
    let split: Vec<_> = all
        .iter()
        .filter(|e| e.label.starts_with("hopper bwd Main") && e.label.contains(" headsplit"))
        .cloned()
        .collect();
    assert!(
        split.iter().any(|e| e.label.contains("d=64"))
            && split.iter().any(|e| e.label.contains("d=128")),
        "head-split main variants at d = 64 and 128"
    );
    let unsplit: Vec<_> = split
        .iter()
        .map(|e| {
            let label = e.label.replace(" headsplit", "");
            all.iter()
                .find(|u| u.label == label)
                .unwrap_or_else(|| panic!("{}: no unsplit variant in the catalog", e.label))
                .clone()
        })
        .collect();
    let combine: Vec<_> = all
        .iter()
        .filter(|e| e.label.starts_with("hopper bwd Combine"))
        .cloned()
        .collect();
    assert!(
        !combine.is_empty(),
        "the combine kernels are in the catalog"
    );
    let step_loop = |label: &str, sass: &str| {
        let body = calico_cuda::disasm::innermost_loop_with(sass, "HGMMA")
            .unwrap_or_else(|| panic!("{label}: no loop around HGMMA"));
        let local = body
            .iter()
            .filter(|t| t.starts_with("LDL") || t.starts_with("STL"));
        (body.len(), local.count())
    };
    let Some(split) = nvidia_sass("sm_90a", split) else {
        return;
    };
    let Some(unsplit) = nvidia_sass("sm_90a", unsplit) else {
        return;
    };
    for ((e, sass), (_, base)) in split.iter().zip(&unsplit) {
        let (n, spills) = step_loop(&e.label, sass);
        let (base_n, base_spills) = step_loop(&e.label, base);
        println!(
            "{}: step loop {n} instructions, {spills} LDL/STL (unsplit: {base_n}, {base_spills})",
            e.label
        );
        assert!(
            spills <= base_spills,
            "{}: more local memory in the step loop than unsplit",
            e.label
        );
    }
    for (e, sass) in nvidia_sass("sm_90a", combine).unwrap_or_default() {
        let count = |op: &str| calico_cuda::disasm::count_opcode(&sass, op);
        assert_eq!(count("LDL") + count("STL"), 0, "{}: local memory", e.label);
    }
}

/// The lazy-softmax Hopper attention forwards at head dims 128 and 256 (the defaults among
/// them; 128-, 160- and 176-key blocks, with and without the stale-max softmax, packed,
/// padded, traced) keep their registers in the key loop: no local memory (LDL/STL) in the
/// innermost loop around their wgmma. Spills there cost whole percents (the soft-capped
/// 176-key variant's did, docs/perf-log.md session 20), and nothing else shows them before a
/// GPU run. (The three-consumer d = 64 forms and the soft-capped ones are left out: some of
/// them, the packed d = 64 default among them, keep a spilled word there today.)
#[test]
fn hopper_attention_forward_key_loops_keep_their_registers() {
    if !toolchain_or_skip("sm_90a disassembly", nvrtc_available()) {
        return;
    }
    let entries: Vec<_> = catalog::entries("sm_90a", Some("attention_hopper"))
        .expect("catalog assembles")
        .into_iter()
        .filter(|e| {
            let l = &e.label;
            l.starts_with("hopper fwd")
                && l.contains("ilp lazy")
                && !l.contains("softcap=true")
                && !l.contains("d=64")
                && !l.contains("bn=192")
        })
        .collect();
    assert!(
        entries.iter().any(|e| e.label.contains("varlen")),
        "the packed forward is among them"
    );
    for (e, sass) in nvidia_sass("sm_90a", entries).unwrap_or_default() {
        let key_loop = calico_cuda::disasm::innermost_loop_with(&sass, "HGMMA")
            .unwrap_or_else(|| panic!("{}: no loop around HGMMA", e.label));
        let spills = key_loop
            .iter()
            .filter(|t| t.starts_with("LDL") || t.starts_with("STL"))
            .count();
        println!(
            "{}: key loop {} instructions, {spills} LDL/STL",
            e.label,
            key_loop.len()
        );
        assert_eq!(spills, 0, "{}: local memory in the key loop", e.label);
    }
}

/// Compiles each sm_90a catalog entry and checks that its SASS has wgmma (HGMMA) fed by TMA
/// (UTMALDG); the GEMM's staged-store variants also store D with 16-byte global stores, no TMA
/// store and no local memory. Reports "skipped" (or fails under CI=true) when the
/// disassembler is missing.
fn assert_hgmma_fed_by_tma(entries: Vec<catalog::CatalogEntry>) {
    for (e, sass) in nvidia_sass("sm_90a", entries).unwrap_or_default() {
        let count = |op: &str| calico_cuda::disasm::count_opcode(&sass, op);
        let (hgmma, utmaldg) = (count("HGMMA"), count("UTMALDG"));
        println!("{}: {hgmma} HGMMA, {utmaldg} UTMALDG", e.label);
        assert!(
            hgmma > 0 && utmaldg > 0,
            "{}: {hgmma} HGMMA, {utmaldg} UTMALDG",
            e.label
        );
        if e.label.contains("store=staged") {
            let (stg128, utmastg) = (count("STG.E.128"), count("UTMASTG"));
            let spills = count("STL") + count("LDL");
            println!("{}: {stg128} STG.E.128, {utmastg} UTMASTG", e.label);
            assert!(stg128 > 0 && utmastg == 0, "{}", e.label);
            assert_eq!(spills, 0, "{}: local memory", e.label);
        }
    }
}

/// A kernel written only against the shared tile vocabulary (calico/tiles.h) compiles for
/// every vendor target, and lands on each vendor's matrix instructions.
#[test]
fn shared_vocabulary_kernel_compiles_for_all_four_targets() {
    const KERNEL: &str = include_str!("../device/tiles/vocabulary.cu");
    for target in four_targets() {
        let (vendor, mma) = if target.starts_with("gfx") {
            (calico_hip::hip_headers(), "v_mfma_f32_16x16x16")
        } else {
            (calico_cuda::device_headers(), "HMMA")
        };
        let source = calico_core::KernelSource::assemble(
            "vocabulary_attention_tile",
            KERNEL,
            &[vendor, calico_core::device_headers()],
            &[],
        )
        .unwrap();
        let binary = catalog::compile(target, &source).unwrap_or_else(|e| panic!("{target}: {e}"));
        let asm = match catalog::disassemble(target, &binary) {
            Ok(asm) => asm,
            Err(err) => {
                toolchain_or_skip(&format!("{target} disassembler"), Err(err.to_string()));
                continue;
            }
        };
        // mma_ABt and mma_AB on 16 x 64 x 64: 16 + 16 MFMAs of 16x16x16 on AMD; HMMA on NVIDIA.
        let count = asm.matches(mma).count();
        println!("{target}: {count} x {mma}");
        assert!(count > 0, "{target}: no {mma} in\n{asm}");
        if target.starts_with("gfx") {
            assert_eq!(count, 32, "{target}");
        }
    }
}

/// The vendor-neutral tile GEMM (gemm/tile.cu, written only against calico/tiles.h) compiles
/// for sm_80, sm_90a, gfx90a and gfx942 in all four layout products and lands on each vendor's
/// matrix instructions: HMMA on NVIDIA; on CDNA v_mfma 16x16x16, no scratch (spills) and at
/// least two waves per SIMD.
#[test]
fn tile_gemm_compiles_on_the_shared_vocabulary_for_all_four_targets() {
    for target in four_targets() {
        let entries: Vec<_> = catalog::entries(target, Some("gemm"))
            .expect("catalog assembles")
            .into_iter()
            .filter(|e| e.label.starts_with("tile "))
            .collect();
        for product in ["mma_AB", "mma_ABt", "mma_AtB", "mma_AtBt"] {
            let tag = format!(" {product} ");
            assert!(
                entries.iter().any(|e| e.label.contains(&tag)),
                "{target}: no tile GEMM variant on {product}"
            );
        }
        for e in &entries {
            let what = format!("{target} {}", e.label);
            if target.starts_with("gfx") {
                let (asm, kernels) = compile_amd(target, e);
                let mfma = asm.matches("v_mfma_f32_16x16x16").count();
                assert!(mfma > 0, "{what}: no v_mfma_f32_16x16x16");
                // Operands with 16-byte aligned rows move in 16-byte chunks.
                let wide = asm.matches("global_load_dwordx4").count();
                assert!(
                    (wide > 0) == e.label.contains("=true"),
                    "{what}: {wide} global_load_dwordx4"
                );
                // ... and go into LDS in one ds_write_b128 each (gt's store).
                let lds16 = asm.matches("ds_write_b128").count();
                assert!(
                    (lds16 > 0) == e.label.contains("=true"),
                    "{what}: {lds16} ds_write_b128"
                );
                assert_eq!(kernels.len(), 1, "{what}");
                println!(
                    "{what}: {mfma} MFMA, {wide} dwordx4; {}",
                    kernels[0].summary()
                );
                assert_fits(&what, &kernels[0], 2);
            } else {
                let cubin = catalog::compile(target, &e.source)
                    .unwrap_or_else(|err| panic!("{what}: {err}"));
                let sass = match catalog::disassemble(target, &cubin) {
                    Ok(s) => s,
                    Err(err) => {
                        toolchain_or_skip("cuobjdump", Err(err.to_string()));
                        return;
                    }
                };
                let hmma = calico_cuda::disasm::count_opcode(&sass, "HMMA");
                // Fragments come from shared tiles by ldmatrix: row_l ones (A of mma_AB /
                // mma_ABt, B of mma_ABt / mma_AtBt) plain, col_l ones (the transposed
                // operands) with .trans.
                let ldsm = calico_cuda::disasm::count_opcode(&sass, "LDSM.16.M88");
                let ldsm_t = calico_cuda::disasm::count_opcode(&sass, "LDSM.16.MT88");
                let plain = !e.label.contains(" mma_AtB ");
                let transposed = !e.label.contains(" mma_ABt ");
                assert!(
                    (ldsm > 0) == plain && (ldsm_t > 0) == transposed,
                    "{what}: {ldsm} LDSM, {ldsm_t} LDSM.T"
                );
                let wide = calico_cuda::disasm::count_opcode(&sass, "LDG.E.128");
                assert!(
                    (wide > 0) == e.label.contains("=true"),
                    "{what}: {wide} LDG.E.128"
                );
                let sts16 = calico_cuda::disasm::count_opcode(&sass, "STS.128");
                assert!(
                    (sts16 > 0) == e.label.contains("=true"),
                    "{what}: {sts16} STS.128"
                );
                println!("{what}: {hmma} HMMA, {ldsm} LDSM, {ldsm_t} LDSM.T, {wide} LDG.128");
                assert!(hmma > 0, "{what}: no HMMA");
            }
        }
    }
}

/// The CDNA GEMM is what it claims to be on gfx90a and gfx942: MFMA fed by buffer loads, with
/// s_setprio around the matrix-core phase, no scratch (spills), the LDS within one CU's 64 KiB
/// and two waves per SIMD (one of each ping-pong half), as `calico compile --op gemm --target
/// gfx942 --disasm` shows a user.
#[test]
fn cdna_gemm_uses_mfma_and_buffer_loads_without_scratch() {
    if !toolchain_or_skip("gfx90a/gfx942", clang_available()) {
        return;
    }
    for target in ["gfx90a", "gfx942"] {
        let entries: Vec<_> = catalog::entries(target, Some("gemm"))
            .expect("catalog assembles")
            .into_iter()
            .filter(|e| e.label.starts_with("cdna"))
            .collect();
        assert!(!entries.is_empty(), "{target}: no CDNA GEMM variants");
        for e in &entries {
            let what = format!("{target} {}", e.label);
            let (asm, kernels) = compile_amd(target, e);
            let mfma = asm.matches("v_mfma_f32_16x16x16").count();
            let buffer_loads = asm.matches("buffer_load_dwordx4").count();
            assert!(
                mfma > 0 && buffer_loads > 0,
                "{what}: {mfma} MFMA, {buffer_loads} buffer loads"
            );
            assert!(asm.contains("s_setprio 1"), "{what}: no s_setprio");
            assert_eq!(kernels.len(), 1, "{what}");
            let k = &kernels[0];
            println!(
                "{what}: {mfma} MFMA, {buffer_loads} buffer loads; {}",
                k.summary()
            );
            assert!(k.lds_bytes <= 64 * 1024, "{what}");
            assert_fits(&what, k, 2);
        }
    }
}

/// The CDNA decode GEMV streams the weight only through buffer_load_dwordx4 (no flat or global
/// loads but the epilogue's C and bias), uses no scratch and keeps at least four waves per SIMD, on gfx90a and gfx942.
#[test]
fn cdna_gemv_streams_buffer_loads_without_scratch() {
    if !toolchain_or_skip("gfx90a/gfx942", clang_available()) {
        return;
    }
    for target in ["gfx90a", "gfx942"] {
        let entries: Vec<_> = catalog::entries(target, Some("gemm"))
            .expect("catalog assembles")
            .into_iter()
            .filter(|e| e.label.starts_with("gemv cdna"))
            .collect();
        assert!(entries.len() >= 4, "{target}: CDNA GEMV variants missing");
        for e in &entries {
            let what = format!("{target} {}", e.label);
            let (asm, kernels) = compile_amd(target, e);
            let buffer_loads = asm.matches("buffer_load_dwordx4").count();
            assert!(buffer_loads > 0, "{what}: no buffer_load_dwordx4");
            // W and A are read only by buffer loads: any global/flat load is the epilogue's C or
            // bias, after the stream's last buffer load.
            let last_buffer_load = asm.rfind("buffer_load_dwordx4").unwrap_or(0);
            for generic in ["global_load", "flat_load"] {
                if let Some(at) = asm.find(generic) {
                    assert!(
                        at > last_buffer_load
                            && (e.label.contains("c=true") || e.label.contains("bias=true")),
                        "{what}: {generic} in the weight stream"
                    );
                }
            }
            let k = &kernels[0];
            println!(
                "{what}: {buffer_loads} buffer_load_dwordx4; {}",
                k.summary()
            );
            assert_fits(&what, k, 4);
        }
    }
}

/// The CDNA row kernels (norms, softmax, rope) move their rows only through buffer resources
/// (loads past a row's end read zeros, stores past it are dropped), use no scratch, and keep
/// at least four waves per SIMD, on gfx90a and gfx942.
#[test]
fn cdna_row_ops_use_buffer_loads_without_scratch() {
    if !toolchain_or_skip("gfx90a/gfx942", clang_available()) {
        return;
    }
    for target in ["gfx90a", "gfx942"] {
        let mut count = 0;
        for op in ["rms_norm", "layer_norm", "softmax", "rope"] {
            let entries = catalog::entries(target, Some(op)).expect("catalog assembles");
            for e in entries.iter().filter(|e| e.label.starts_with("cdna")) {
                count += 1;
                let (asm, kernels) = compile_amd(target, e);
                let what = format!("{target} {op} {}", e.label);
                assert!(asm.contains("buffer_load_dword"), "{what}: no buffer load");
                assert!(
                    asm.contains("buffer_store_dword"),
                    "{what}: no buffer store"
                );
                if e.label.contains(" 16B ") || e.label.contains("x_width8") {
                    assert!(asm.contains("buffer_load_dwordx4"), "{what}");
                    assert!(asm.contains("buffer_store_dwordx4"), "{what}");
                }
                for generic in ["global_load", "global_store", "flat_load", "flat_store"] {
                    assert!(!asm.contains(generic), "{what}: {generic}");
                }
                let k = &kernels[0];
                println!("{what}: {}", k.summary());
                assert_fits(&what, k, 4);
            }
        }
        assert!(count >= 20, "{target}: {count} CDNA row variants");
    }
}

/// The CDNA attention forward is what it claims to be on gfx90a and gfx942: MFMA fed by buffer
/// loads staged in LDS, no scratch (spills), at most 32 KiB of LDS and two waves per SIMD, as
/// `calico compile --op attention --target gfx942 --disasm` shows a user.
#[test]
fn cdna_attention_uses_mfma_and_buffer_loads_without_scratch() {
    if !toolchain_or_skip("gfx90a/gfx942", clang_available()) {
        return;
    }
    for target in ["gfx90a", "gfx942"] {
        let entries: Vec<_> = catalog::entries(target, Some("attention"))
            .expect("catalog assembles")
            .into_iter()
            .filter(|e| e.label.starts_with("cdna"))
            .collect();
        assert_eq!(
            entries.len(),
            8,
            "{target}: bf16/f16 x d64/128/256, and d40 / d120 on the 64 / 128 widths"
        );
        for e in &entries {
            let (asm, kernels) = compile_amd(target, e);
            let what = format!("{target} {}", e.label);
            let mfma = asm.matches("v_mfma_f32_16x16x16").count();
            let buffer_loads = asm.matches("buffer_load_dwordx4").count();
            let lds_reads = asm.matches("ds_read_b64").count();
            assert!(
                mfma > 0 && buffer_loads > 0 && lds_reads > 0,
                "{what}: {mfma} MFMA, {buffer_loads} buffer loads, {lds_reads} ds_read_b64"
            );
            let k = &kernels[0];
            println!(
                "{what}: {mfma} MFMA, {buffer_loads} buffer loads, {lds_reads} ds_read_b64; {}",
                k.summary()
            );
            assert!(k.lds_bytes <= 32 * 1024, "{what}: {}", k.summary());
            assert_fits(&what, k, 2);
        }
    }
}

/// The user-kernel example (kernels/examples/tile_softmax.cu, docs/tile-kernels.md) compiles
/// for all four targets through the public `TileKernel` API.
#[test]
fn tile_kernel_example_compiles_for_all_four_targets() {
    let kernel = calico::tile_kernel::TileKernel::new(
        "tile_softmax",
        include_str!("../examples/tile_softmax.cu"),
    )
    .define("COLS", 64);
    for target in four_targets() {
        let binary = kernel
            .compile_for(target)
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert!(!binary.is_empty(), "{target}");
    }
}

/// The vendor-neutral tile attention forward (kernels/device/attention/tiles.cu, one source
/// for both vendors) compiles for sm_80, sm_90a, gfx90a and gfx942 and lands on each vendor's
/// matrix instructions (HMMA / v_mfma_f32_16x16x16) with no spills (no STL/LDL local memory on
/// NVIDIA, no scratch on AMD) and reads K and V^T from shared memory as row_l fragments
/// (LDSM without .trans / ds_read_b64); on AMD at least two waves per SIMD, as `calico compile
/// --op attention --target gfx942 --disasm` shows a user.
#[test]
fn vendor_neutral_tile_attention_compiles_for_all_four_targets() {
    for target in four_targets() {
        let entries: Vec<_> = catalog::entries(target, Some("attention"))
            .expect("catalog assembles")
            .into_iter()
            .filter(|e| e.label.starts_with("tiles fwd"))
            .collect();
        assert_eq!(
            entries.len(),
            14,
            "{target}: bf16/f16 x d16/48/64/96/128/160/256"
        );
        for e in &entries {
            let what = format!("{target} {}", e.label);
            if target.starts_with("gfx") {
                let (asm, kernels) = compile_amd(target, e);
                let mfma = asm.matches("v_mfma_f32_16x16x16").count();
                assert!(mfma > 0, "{what}: no MFMA");
                // K and V^T fragments are row_l reads: one ds_read_b64 per base tile, never
                // the four 2-byte reads of a col_l fragment.
                let (reads, narrow) = (
                    asm.matches("ds_read_b64").count(),
                    asm.matches("ds_read_u16").count(),
                );
                assert!(
                    reads > 0 && narrow == 0,
                    "{what}: {reads} ds_read_b64, {narrow} ds_read_u16"
                );
                let k = &kernels[0];
                println!("{what}: {mfma} MFMA, {reads} ds_read_b64; {}", k.summary());
                assert_fits(&what, k, 2);
            } else {
                let binary = catalog::compile(target, &e.source).expect("compiles");
                let sass = match catalog::disassemble(target, &binary) {
                    Ok(s) => s,
                    Err(err) => {
                        toolchain_or_skip(&format!("{target} disassembler"), Err(err.to_string()));
                        continue;
                    }
                };
                let hmma = calico_cuda::disasm::count_opcode(&sass, "HMMA");
                // Both products read row_l fragments (ldmatrix without .trans: V^T is staged).
                let ldsm = calico_cuda::disasm::count_opcode(&sass, "LDSM.16.M88");
                let ldsm_t = calico_cuda::disasm::count_opcode(&sass, "LDSM.16.MT88");
                assert!(
                    ldsm > 0 && ldsm_t == 0,
                    "{what}: {ldsm} LDSM, {ldsm_t} LDSM.T"
                );
                let spills = calico_cuda::disasm::count_opcode(&sass, "STL")
                    + calico_cuda::disasm::count_opcode(&sass, "LDL");
                println!("{what}: {hmma} HMMA, {spills} local-memory accesses");
                assert!(hmma > 0, "{what}: no HMMA");
                assert_eq!(spills, 0, "{what}: spills to local memory");
            }
        }
    }
}

/// The NVIDIA decode GEMV keeps its loads in registers: every catalog variant (the M = 1 default
/// and the M = 16 shape `CALICO_GEMV_TUNE=fit=1` picks among them) has mma.sync and no local
/// memory on sm_90a, where it is timed (the 16-warp M = 16 shape spilled: 249 STL). sm_80's
/// ptxas keeps one 8-byte spill in the M = 1 default's bounds-checked last K step.
#[test]
fn gemv_streams_the_weight_without_spills() {
    if !toolchain_or_skip("sm_90a", nvrtc_available()) {
        return;
    }
    let target = "sm_90a";
    {
        let entries: Vec<_> = catalog::entries(target, Some("gemm"))
            .expect("catalog assembles")
            .into_iter()
            .filter(|e| e.label.starts_with("gemv ") && !e.label.contains("cdna"))
            .collect();
        assert!(
            entries.len() >= 6,
            "{target}: {} GEMV variants",
            entries.len()
        );
        for (e, binary) in compile_entries(target, entries) {
            let sass = match catalog::disassemble(target, &binary) {
                Ok(s) => s,
                Err(err) => {
                    toolchain_or_skip(&format!("{target} disassembler"), Err(err.to_string()));
                    return;
                }
            };
            let count = |op: &str| calico_cuda::disasm::count_opcode(&sass, op);
            let spills = count("STL") + count("LDL");
            println!(
                "{target} {}: {} HMMA, {spills} local-memory accesses",
                e.label,
                count("HMMA")
            );
            assert!(count("HMMA") > 0, "{target} {}: no HMMA", e.label);
            assert_eq!(spills, 0, "{target} {}: spills to local memory", e.label);
        }
    }
}
