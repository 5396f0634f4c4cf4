#!/usr/bin/env python3
"""How fast a plain read (and a copy) of N bytes runs on this GPU, by size, timed as
calico-bench times its cases: device events, median, each run after an untimed read-only pass
over 512 MiB that evicts the L2 and leaves it clean.

A small memory-bound op (a 32 MiB decode GEMV weight, a 33 MiB decode KV cache) cannot beat
the read of the same bytes; this prints what that read reaches against the 1 GiB copy that the
benchmark's percentages divide by.

Usage (on the GPU machine): python3 benches/gpu/read_bandwidth.py [--sizes-mib 16,32,64,...]
Reads use torch's sum over bf16 elements (one pass, result discarded); copies use copy_.
"""
import argparse

import torch


def median_ms(fn, pad, runs=100):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        pad()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="8,16,32,64,128,256,1024")
    args = ap.parse_args()
    big = torch.zeros(256 << 20, device="cuda", dtype=torch.bfloat16)  # 512 MiB

    def pad():
        big.sum()

    copy_src = torch.randn(512 << 20, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    copy_dst = torch.empty_like(copy_src)
    copy_ms = median_ms(lambda: copy_dst.copy_(copy_src), pad, 30)
    copy_gbps = 2 * copy_src.numel() * 2 / copy_ms / 1e6
    print(f"copy 1 GiB: {copy_ms:.4f} ms, {copy_gbps:.0f} GB/s (read + write)")
    del copy_src, copy_dst
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        n = (mib << 20) // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        read_ms = median_ms(lambda: x.sum(), pad)
        copy_ms = median_ms(lambda: y.copy_(x), pad)
        read_gbps = n * 2 / read_ms / 1e6
        cgbps = 2 * n * 2 / copy_ms / 1e6
        print(
            f"{mib:5d} MiB: read {read_ms * 1e3:8.1f} us {read_gbps:5.0f} GB/s "
            f"({100 * read_gbps / copy_gbps:5.1f}% of the 1 GiB copy); "
            f"copy {copy_ms * 1e3:8.1f} us {cgbps:5.0f} GB/s ({100 * cgbps / copy_gbps:5.1f}%)"
        )


if __name__ == "__main__":
    main()
