#!/usr/bin/env bash
# One device call for GEMM work: GPU conformance of the GEMM under several CALICO_HOPPER_TUNE
# settings, then `calico bench --only <filter>` once per setting, each report kept under
# $OUT/<n>/ and a table of every GEMM row printed last.
#
#   bash benches/gpu/gemm-tune.sh "<filter>" "<tune for tests>;<tune>..." "<tune for bench>;<tune>..."
#
# Tunes are CALICO_HOPPER_TUNE strings ("" for the defaults); separate them with ';' and
# write ',' inside one. Run from the repository root after scripts/gpu-pack.sh.
set -uo pipefail
filter=${1:-gemm}
IFS=';' read -r -a test_tunes <<<"${2-}"
IFS=';' read -r -a bench_tunes <<<"${3-}"
out=${OUT:-/tmp/gemm-tune}
mkdir -p "$out"
rc=0
for t in "${test_tunes[@]}"; do
  echo "=== conformance gemm, CALICO_HOPPER_TUNE='$t'"
  start=$(date +%s)
  log="$out/conformance-$(printf '%s' "$t" | tr -c 'A-Za-z0-9' '_').log"
  CALICO_HOPPER_TUNE="$t" bash .gpu/run.sh tests gemm -q >"$log" 2>&1 || rc=1
  grep -E "test result|FAILED|panicked" "$log" | head -20 | tee -a "$out/conformance.summary"
  echo "    ($(( $(date +%s) - start )) s)"
done
n=0
for t in "${bench_tunes[@]}"; do
  n=$((n + 1))
  echo "=== bench '$filter', CALICO_HOPPER_TUNE='$t'"
  CALICO_HOPPER_TUNE="$t" bash .gpu/run.sh bin calico bench --only "$filter" --out "$out/$n" >"$out/$n.log" 2>&1 || rc=1
  echo "$t" >"$out/$n.tune"
done
echo
echo "=== conformance (each tune in order)"
cat "$out/conformance.summary" 2>/dev/null
echo "=== summary (TFLOP/s, cuBLASLt, ratio) per tune"
for ((i = 1; i <= n; i++)); do
  echo "--- [$i] CALICO_HOPPER_TUNE='$(cat "$out/$i.tune")'"
  grep -h "^| gemm" "$out/$i"/*/report.md 2>/dev/null | awk -F'|' 'NF > 8 {printf "%-34s %8s %8s %7s\n", $2, $5, $7, $8}' || tail -5 "$out/$i.log"
done
exit $rc
