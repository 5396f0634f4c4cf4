#!/usr/bin/env bash
# Nsight Compute profile of Calico's GEMM and cuBLASLt on one bench case, clocks left as found
# (--clock-control none: the card's settings are never touched). Full reports go to
# $OUT/ncu-*.txt; the key figures are printed last.
#
#   bash benches/gpu/profile-gemm.sh "gemm square 4096"
set -uo pipefail
case_filter=${1:-gemm square 4096}
out=${OUT:-/tmp/profile-gemm}
mkdir -p "$out"
metrics='gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,regex:^sm__pipe_tensor_op.*_cycles_active\.avg\.pct_of_peak_sustained_(active|elapsed)$,regex:^sm__inst_executed_pipe_tensor.*\.sum$,smsp__average_warp_latency_issue_stalled_barrier.ratio'
for who in calico cublaslt; do
  if [[ $who == calico ]]; then k='regex:calico_gemm_hopper'; else k='regex:sm90_|xmma|cutlass|nvjet'; fi
  ncu --clock-control none --cache-control none -k "$k" --launch-skip 10 -c 1 \
      --section SpeedOfLight --section WarpStateStats --section LaunchStats --metrics "$metrics" \
      bash .gpu/run.sh bin calico bench --only "$case_filter" --out "$out/bench-$who" >"$out/ncu-$who.txt" 2>&1
  echo "=== $who ($case_filter)"
  grep -E "^  [a-z_]+.*(calico|sm90|xmma|cutlass|nvjet)|Duration|SM Frequency|gpu__time|sm__cycles_elapsed.avg.per|pipe_tensor|inst_executed_pipe_tensor|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Registers Per|Stall|stalled|Grid Size|Block Size|throughput.avg" "$out/ncu-$who.txt" | head -40
done
