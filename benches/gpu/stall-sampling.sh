#!/usr/bin/env bash
# Warp-stall sampling of one Calico kernel on one bench case (Nsight Compute, clocks left as
# found): the SASS of the kernel with the sampled stall reasons per instruction, written to
# $OUT/stalls-sass.csv; the samples per stall reason and the 40 instructions with the most
# samples are printed.
#
#   CALICO_HOPPER_TUNE=... bash benches/gpu/stall-sampling.sh "gemm square 4096"
#   STALL_KERNEL=calico_attention_hopper_fwd bash benches/gpu/stall-sampling.sh "attention fwd d128 N512"
# Environment: STALL_KERNEL (kernel name regex, default calico_gemm_hopper), STALL_RUN (the
# packed runner, default .gpu/run.sh from scripts/gpu-pack.sh).
set -uo pipefail
case_filter=${1:-gemm square 4096}
kernel=${STALL_KERNEL:-calico_gemm_hopper}
runner=${STALL_RUN:-.gpu/run.sh}
out=${OUT:-/tmp/stall-sampling}
mkdir -p "$out"
ncu --clock-control none --cache-control none -k "regex:$kernel" --launch-skip 10 -c 1 \
    --section SourceCounters --section WarpStateStats -o "$out/stalls" \
    bash "$runner" bin calico bench --only "$case_filter" --out "$out/bench" >"$out/ncu-run.txt" 2>&1
ncu --import "$out/stalls.ncu-rep" --page source --csv --print-source sass >"$out/stalls-sass.csv" 2>"$out/import.err"
ncu --import "$out/stalls.ncu-rep" --page details >"$out/stalls-details.txt" 2>&1
python3 - "$out/stalls-sass.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
# The export starts with a "Kernel Name" line, then the column header.
while rows and "Address" not in rows[0]:
    rows.pop(0)
if not rows:
    print("no SASS table in the export"); sys.exit()
head, body = rows[0], rows[1:]
samp, src, addr = (head.index(n) for n in ("Warp Stall Sampling (All Samples)", "Source", "Address"))
reasons = [(i, h[len("stall_"):]) for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]
num = lambda v: float(v.replace(",", "") or 0)
data = [(num(r[samp]), r) for r in body if len(r) > samp]
total = sum(d[0] for d in data) or 1
by_reason = {}
for _, r in data:
    for i, name in reasons:
        by_reason[name] = by_reason.get(name, 0.0) + num(r[i])
print("samples per stall reason (% of all):")
for name, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:12]:
    print(f"  {100 * v / total:6.2f}%  {name}")
for s, r in sorted(data, key=lambda d: -d[0])[:40]:
    top = sorted(((num(r[i]), name) for i, name in reasons), reverse=True)[:2]
    print(f"{100 * s / total:6.2f}%  {r[addr][-6:]:>6}  {r[src][:70]:70}  {top}")
PY
