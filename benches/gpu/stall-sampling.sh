#!/usr/bin/env bash
# Warp-stall sampling of Calico's Hopper GEMM on one bench case (Nsight Compute, clocks left as
# found): the SASS of the kernel with the sampled stall reasons per instruction, written to
# $OUT/stalls-sass.csv; the 40 instructions with the most samples are printed.
#
#   CALICO_HOPPER_TUNE=... bash benches/gpu/stall-sampling.sh "gemm square 4096"
set -uo pipefail
case_filter=${1:-gemm square 4096}
out=${OUT:-/tmp/stall-sampling}
mkdir -p "$out"
ncu --clock-control none --cache-control none -k regex:calico_gemm_hopper --launch-skip 10 -c 1 \
    --section SourceCounters --section WarpStateStats -o "$out/stalls" \
    bash .gpu/run.sh bin calico bench --only "$case_filter" --out "$out/bench" >"$out/ncu-run.txt" 2>&1
ncu --import "$out/stalls.ncu-rep" --page source --csv --print-source sass >"$out/stalls-sass.csv" 2>"$out/import.err"
ncu --import "$out/stalls.ncu-rep" --page details >"$out/stalls-details.txt" 2>&1
python3 - "$out/stalls-sass.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
if not rows:
    print("no rows"); sys.exit()
head = rows[0]
print("columns:", [h for h in head][:40])
def col(name):
    for i, h in enumerate(head):
        if h.strip() == name: return i
    return None
samp = col("Warp Stall Sampling (All Samples)")
src = col("Source")
addr = col("Address")
if samp is None or src is None:
    print("columns not found"); sys.exit()
body = []
for r in rows[1:]:
    try: body.append((float(r[samp].replace(",", "") or 0), r[addr] if addr is not None else "", r[src]))
    except (ValueError, IndexError): pass
total = sum(b[0] for b in body) or 1
stall_cols = [i for i, h in enumerate(head) if h.startswith("stall_") or "Stall" in h]
for s, a, text in sorted(body, reverse=True)[:40]:
    print(f"{100*s/total:6.2f}%  {a:>8}  {text}")
PY
