//! What `calico compile --disasm` and `calico bench --dry-run` show a user about AMD kernels,
//! read back from their output: each kernel's VGPRs, AGPRs, SGPRs, LDS, scratch and the
//! occupancy that follows, with values a CDNA CU can hold. clang-19 compiles and llvm-19 reads
//! the code objects, with no GPU; where those tools are missing each test says by name that it
//! is skipped, and under CI=true it fails instead.

mod common;

use common::calico;
use std::process::{Command, Output};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The first of clang, llvm-objdump and llvm-readelf (as the HIP backend finds them) that
/// does not run, and why.
fn missing_amd_tool() -> Option<String> {
    [
        ("CALICO_CLANG", "clang-19"),
        ("CALICO_LLVM_OBJDUMP", "llvm-objdump-19"),
        ("CALICO_LLVM_READELF", "llvm-readelf-19"),
    ]
    .into_iter()
    .find_map(|(var, default)| {
        let tool = std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_string());
        match Command::new(&tool).arg("--version").output() {
            Ok(out) if out.status.success() => None,
            _ => Some(format!(
                "{tool} not found (install clang-19, lld-19, llvm-19 or set {var})"
            )),
        }
    })
}

/// True when `test` can run; otherwise prints `skipped: TEST: why` (or, in CI, fails).
fn amd_tools_or_skip(test: &str) -> bool {
    match missing_amd_tool() {
        None => true,
        Some(why) if in_ci() => panic!("{test}: toolchain missing in CI: {why}"),
        Some(why) => {
            println!("skipped: {test}: {why}");
            false
        }
    }
}

/// Runs `calico` with no GPU visible, so that nothing it prints can come from a device.
fn run_without_device(args: &[&str]) -> (String, String) {
    let out: Output = calico()
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("HIP_VISIBLE_DEVICES", "")
        .env("ROCR_VISIBLE_DEVICES", "")
        .output()
        .expect("the calico binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "calico {}: exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        args.join(" "),
        out.status
    );
    (stdout, stderr)
}

/// One kernel's line as `KernelResources::summary` prints it: `NAME: VGPR v, AGPR a, SGPR s
/// (n spilled to VGPR lanes), LDS l B, scratch c B (n VGPRs spilled), workgroup w -> g
/// workgroup(s)/CU, occupancy o waves/SIMD`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Printed {
    name: String,
    vgprs: u32,
    agprs: u32,
    sgprs: u32,
    lds: u32,
    scratch: u32,
    workgroup: u32,
    workgroups_per_cu: u32,
    occupancy: u32,
}

/// The number that follows the first `key` in `text`.
fn number_after(text: &str, key: &str) -> Option<u32> {
    let rest = &text[text.find(key)? + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn parse_summary(line: &str) -> Printed {
    let parse = || {
        let (name, rest) = line.trim().split_once(": VGPR ")?;
        let rest = format!(": VGPR {rest}");
        Some(Printed {
            name: name.to_string(),
            vgprs: number_after(&rest, ": VGPR ")?,
            agprs: number_after(&rest, ", AGPR ")?,
            sgprs: number_after(&rest, ", SGPR ")?,
            lds: number_after(&rest, ", LDS ")?,
            scratch: number_after(&rest, ", scratch ")?,
            workgroup: number_after(&rest, ", workgroup ")?,
            workgroups_per_cu: number_after(&rest, " -> ")?,
            occupancy: number_after(&rest, ", occupancy ")?,
        })
    };
    parse().unwrap_or_else(|| panic!("not a resources summary: {line:?}"))
}

/// A row of a table whose last `columns` cells are numbers: (the label before them, numbers).
fn parse_row(line: &str, columns: usize) -> Option<(String, Vec<u32>)> {
    let cells: Vec<&str> = line.split_whitespace().collect();
    let split = cells.len().checked_sub(columns).filter(|&s| s > 0)?;
    let numbers = cells[split..]
        .iter()
        .map(|c| c.parse().ok())
        .collect::<Option<Vec<u32>>>()?;
    Some((cells[..split].join(" "), numbers))
}

/// The rows under the line `title` and the column header after it, up to a blank line.
fn table<'a>(stdout: &'a str, title: &str, header: &str) -> Vec<&'a str> {
    let mut lines = stdout.lines().skip_while(|l| l.trim() != title);
    assert!(lines.next().is_some(), "no {title:?} in:\n{stdout}");
    let head = lines.next().unwrap_or_default();
    assert_eq!(
        head.split_whitespace().collect::<Vec<_>>(),
        header.split_whitespace().collect::<Vec<_>>(),
        "the header under {title:?}"
    );
    lines.take_while(|l| !l.trim().is_empty()).collect()
}

const RESOURCES_HEADER: &str = "variant VGPR AGPR SGPR LDS scratch WG/CU waves/SIMD";

/// The resources table's row for a kernel must repeat its summary line's numbers.
fn assert_row_matches(row: &str, label: &str, k: &Printed) {
    let (row_label, n) = parse_row(row, 7).unwrap_or_else(|| panic!("bad row {row:?}"));
    assert_eq!(row_label, label, "row {row:?}");
    assert_eq!(
        n,
        [
            k.vgprs,
            k.agprs,
            k.sgprs,
            k.lds,
            k.scratch,
            k.workgroups_per_cu,
            k.occupancy
        ],
        "the table row {row:?} disagrees with the summary {k:?}"
    );
}

/// Values one CDNA2/CDNA3 CU (4 SIMDs of 512 registers a lane, 64 KiB of LDS, 8 waves a
/// SIMD, wave64) can hold, and an occupancy that follows from them.
fn assert_plausible(what: &str, k: &Printed) {
    assert!((1..=512).contains(&k.vgprs), "{what}: {k:?}");
    assert!(k.agprs <= 256 && k.vgprs + k.agprs <= 512, "{what}: {k:?}");
    assert!((1..=112).contains(&k.sgprs), "{what}: {k:?}");
    assert!(k.lds <= 64 * 1024, "{what}: {k:?}");
    assert!((1..=1024).contains(&k.workgroup), "{what}: {k:?}");
    assert!(k.workgroups_per_cu >= 1, "{what}: no workgroup fits: {k:?}");
    assert!(
        (1..=8).contains(&k.occupancy),
        "{what}: occupancy {} waves/SIMD: {k:?}",
        k.occupancy
    );
    // The waves resident on a CU, spread over its 4 SIMDs, capped at 8 a SIMD.
    let waves_per_workgroup = k.workgroup.div_ceil(64);
    assert_eq!(
        k.occupancy,
        (k.workgroups_per_cu * waves_per_workgroup / 4).min(8),
        "{what}: occupancy does not follow from the workgroups a CU holds: {k:?}"
    );
    assert!(
        k.occupancy * (k.vgprs + k.agprs) <= 512,
        "{what}: more waves than the register file holds: {k:?}"
    );
    assert!(
        k.workgroups_per_cu.saturating_mul(k.lds) <= 64 * 1024,
        "{what}: more workgroups than the LDS holds: {k:?}"
    );
}

/// `calico compile --op gemm --target TARGET --disasm --no-source --label cdna`: every CDNA
/// GEMM and GEMV variant compiles, and each shows one kernel's resources, repeated in the
/// closing table, plausible and without scratch; the GEMM's instruction counts show MFMA and
/// buffer loads.
fn check_compile_disasm(target: &str) {
    let args = [
        "compile",
        "--op",
        "gemm",
        "--target",
        target,
        "--disasm",
        "--no-source",
        "--label",
        "cdna",
    ];
    let (stdout, _) = run_without_device(&args);
    let variants: Vec<(String, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("==== gemm ["))
        .map(|l| {
            let (label, rest) = l.split_once("] entry ").expect("variant header");
            let entry = rest.split_whitespace().next().unwrap_or_default();
            (label.to_string(), entry.to_string())
        })
        .collect();
    let kernels: Vec<Printed> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("---- resources: "))
        .map(parse_summary)
        .collect();
    assert!(
        variants.iter().any(|(l, _)| l.starts_with("cdna ")),
        "{target}: no CDNA GEMM variant:\n{stdout}"
    );
    assert_eq!(
        kernels.len(),
        variants.len(),
        "{target}: one kernel's resources per variant"
    );
    let rows = table(
        &stdout,
        &format!("==== gemm on {target}: resources per kernel"),
        RESOURCES_HEADER,
    );
    assert_eq!(rows.len(), kernels.len(), "{target}: resources table");
    let counts = table(
        &stdout,
        &format!("==== gemm on {target}: instruction counts (lines mentioning each)"),
        "variant v_mfma buffer_load global_load_dwordx4",
    );
    assert_eq!(counts.len(), variants.len(), "{target}: counts table");
    for (((label, entry), k), (row, count_row)) in
        variants.iter().zip(&kernels).zip(rows.iter().zip(&counts))
    {
        let what = format!("{target} [{label}]");
        assert_eq!(&k.name, entry, "{what}");
        assert_row_matches(row, label, k);
        assert_plausible(&what, k);
        assert_eq!(k.scratch, 0, "{what}: scratch (spills): {k:?}");
        let (count_label, n) = parse_row(count_row, 3).expect("counts row");
        assert_eq!(&count_label, label, "{what}");
        if label.starts_with("cdna ") {
            assert!(n[0] > 0 && n[1] > 0, "{what}: MFMA and buffer loads: {n:?}");
        }
        println!("{what}: {k:?}");
    }
    let verdict = format!(
        "gemm on {target}: {n} of {n} variants compiled, 0 failed",
        n = variants.len()
    );
    assert!(stdout.contains(&verdict), "{target}: no {verdict:?}");
}

#[test]
fn compile_disasm_shows_cdna_gemm_resources_on_gfx942() {
    if amd_tools_or_skip("compile_disasm_shows_cdna_gemm_resources_on_gfx942") {
        check_compile_disasm("gfx942");
    }
}

#[test]
fn compile_disasm_shows_cdna_gemm_resources_on_gfx90a() {
    if amd_tools_or_skip("compile_disasm_shows_cdna_gemm_resources_on_gfx90a") {
        check_compile_disasm("gfx90a");
    }
}

/// A benchmark case of the dry run and the kernels listed under it.
struct Case {
    name: String,
    kernel_labels: Vec<String>,
    kernels: Vec<Printed>,
}

/// The cases `calico bench --dry-run` lists (up to the blank line before its table).
fn dry_run_cases(stdout: &str, target: &str) -> Vec<Case> {
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next(),
        Some(format!("==== calico bench --dry-run {target}: nothing is timed").as_str())
    );
    let mut cases: Vec<Case> = Vec::new();
    for line in lines.take_while(|l| !l.trim().is_empty()) {
        if line.starts_with("    ") {
            let case = cases.last_mut().expect("a kernel under a case");
            case.kernels.push(parse_summary(line));
            continue;
        }
        let (name, label) = line
            .split_once(": ")
            .unwrap_or_else(|| panic!("not `case: kernel`: {line:?}"));
        match cases.last_mut() {
            // A case of several kernels lists each on its own line.
            Some(c) if c.name == name => c.kernel_labels.push(label.to_string()),
            _ => cases.push(Case {
                name: name.to_string(),
                kernel_labels: vec![label.to_string()],
                kernels: Vec::new(),
            }),
        }
    }
    cases
}

/// `calico bench --dry-run TARGET` with no device: exits 0 and lists the GEMM, row-op,
/// attention (forward and backward) and decode cases, each with its kernels and their
/// resources, plausible and without scratch, repeated in the closing table; the GEMM, row
/// ops, attention forward and decode run Calico's CDNA kernels.
fn check_dry_run(target: &str, quick: bool) {
    let mut args = vec!["bench", "--dry-run", target];
    if quick {
        args.push("--quick");
    }
    let (stdout, _) = run_without_device(&args);
    let cases = dry_run_cases(&stdout, target);
    let kernels_of = |prefixes: &[&str]| -> Vec<&Printed> {
        let group: Vec<&Case> = cases
            .iter()
            .filter(|c| prefixes.iter().any(|p| c.name.starts_with(p)))
            .collect();
        assert!(!group.is_empty(), "{target}: no {prefixes:?} case");
        group.iter().flat_map(|c| &c.kernels).collect()
    };
    let expect_kernel = |prefixes: &[&str], kernel: &str| {
        assert!(
            kernels_of(prefixes).iter().any(|k| k.name == kernel),
            "{target}: no {prefixes:?} case runs {kernel}"
        );
    };
    expect_kernel(&["gemm "], "calico_gemm_cdna");
    expect_kernel(&["gemv "], "calico_gemv_cdna");
    expect_kernel(&["rms_norm ", "layer_norm "], "calico_norm_cdna");
    expect_kernel(&["add_rms_norm ", "add_layer_norm "], "calico_norm_cdna");
    expect_kernel(&["softmax "], "calico_softmax_cdna");
    expect_kernel(&["rope "], "calico_rope_cdna");
    expect_kernel(&["attention fwd "], "calico_attention_cdna_fwd");
    expect_kernel(&["attention decode "], "calico_attention_decode");
    kernels_of(&["attention bwd "]);

    // The table follows the first blank line, which ends the list of cases.
    let rows = table(&stdout, "", RESOURCES_HEADER);
    let mut rows = rows.iter();
    for case in &cases {
        let what = format!("{target} {}", case.name);
        assert!(
            case.kernels.len() >= case.kernel_labels.len(),
            "{what}: a kernel without resources: {:?}",
            case.kernel_labels
        );
        for k in &case.kernels {
            assert_plausible(&what, k);
            assert_eq!(k.scratch, 0, "{what}: scratch (spills): {k:?}");
            let row = rows
                .next()
                .unwrap_or_else(|| panic!("{what}: no table row"));
            assert_row_matches(row, &format!("{}: {}", case.name, k.name), k);
        }
    }
    assert!(
        rows.next().is_none(),
        "{target}: table rows beyond the cases"
    );
    println!(
        "{target}: {} cases, {} kernels listed",
        cases.len(),
        cases.iter().map(|c| c.kernels.len()).sum::<usize>()
    );
}

#[test]
fn bench_dry_run_lists_cases_with_kernel_resources_on_gfx942() {
    if amd_tools_or_skip("bench_dry_run_lists_cases_with_kernel_resources_on_gfx942") {
        check_dry_run("gfx942", false);
    }
}

#[test]
fn quick_bench_dry_run_lists_cases_with_kernel_resources_on_gfx90a() {
    if amd_tools_or_skip("quick_bench_dry_run_lists_cases_with_kernel_resources_on_gfx90a") {
        check_dry_run("gfx90a", true);
    }
}
