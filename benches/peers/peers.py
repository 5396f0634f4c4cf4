#!/usr/bin/env python3
"""Times torch peers of Calico's benchmark cases and writes JSON for `calico-bench --peers`.

Usage (on the GPU machine):  python3 benches/peers/peers.py --out peers.json [--quick]
Each case: bf16 inputs, median of CUDA-event times, each run after the same untimed,
L2-evicting read-only pad that calico-bench uses (see `_pad`). A case that errors is recorded
with its error and skipped.
"""
import argparse
import json
import sys

import torch

import host_loops

ROWS = 65536
NORM_COLS = [1024, 2048, 4096, 8192]
SOFTMAX_COLS = [4096, 1024]
GEMMS = [(s, s, s) for s in (2048, 4096, 8192)]
GEMMS += [(8192, n, k) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (28672, 4096))]
GEMMS += [(m, 4096, 4096) for m in (16, 64, 256)]
GEMMS += [(64, 1024, 4096)]  # decode through a narrow (GQA key/value) projection
# Decode GEMV (F.linear, weight [N, K]) and odd shapes (K, N or a row stride not a multiple of 8).
GEMVS = [(m, n, k) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336)) for m in (1, 4, 16)]
ODD_GEMMS = [(4097, 4097, 4097), (8191, 8191, 8191), (4096, 4096, 4095), (1000, 999, 1000)]
ODD_ROWS = [4097, 4097]  # softmax and rms_norm with an odd row length
# Decode attention: (batch, context), one query token, GQA 32:8, head_dim 128, contiguous KV.
DECODES = [(1, 8192), (1, 32768), (1, 65536), (1, 131072), (16, 8192), (64, 8192)]
DECODES += [(16, 8192, 96)]  # head_dim 96, as calico-bench's "... contiguous d96" case
# FlashAttention-3's shapes: 16384 tokens in all, hidden 2048 (heads = 2048 / head_dim).
ATTN_TOKENS, ATTN_HIDDEN = 16384, 2048
ATTN_SEQS = [512, 1024, 2048, 4096, 8192, 16384]
ATTN_ODD_SEQS = [1000, 4097]  # full profile, head_dim 128: batch 16384 // N
ATTN_DIMS = [64, 128, 256]  # 256: the backward only at the (N, causal) pairs below, as calico-bench
# Head dim 256 backward: (N, causal) of calico-bench's full profile, and its quick profile's one.
ATTN_D256_BWD = [(n, causal) for n in (1024, 2048, 4096, 8192) for causal in (False, True)]
ATTN_D256_BWD_QUICK = [(4096, True)]


def attention_cases(seqs, d256_bwd=ATTN_D256_BWD):
    """(op, shape [B, H, N, D, causal], make, fn) for SDPA forward and backward through the
    cuDNN and flash backends (bf16, [B, H, N, D] contiguous): head dims 64, 128 and 256 at every
    length (256 backward only at the (N, causal) pairs of `d256_bwd`), 96 (21 heads) at 2048 and
    8192, GQA and the odd lengths at 128, as calico-bench's full profile. A backend that cannot
    run a case (flash's backward at head dim 256 on some builds) raises when timed, and main's
    `record` writes the error in place of a time."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    backends = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))
    problems = [(d, n, 1) for d in ATTN_DIMS for n in seqs]
    problems += [(96, n, 1) for n in (2048, 8192) if n in seqs]
    # GQA, 4 query heads per KV head: K and V are repeated to the query heads before the timed
    # call (SDPA then runs the same FLOPs as MHA; calico-bench's case reads the 4 KV heads).
    problems += [(128, n, 4) for n in (2048, 8192) if n in seqs]
    # Lengths off every tile (calico-bench's "attention fwd d128 N1000" and "... N4097").
    problems += [(128, n, 1) for n in ATTN_ODD_SEQS if len(seqs) == len(ATTN_SEQS)]
    for d, n, group in problems:
        b, h = ATTN_TOKENS // n, ATTN_HIDDEN // d
        for causal in (False, True):
            shape = [b, h, n, d, int(causal)] + ([h // group] if group > 1 else [])
            for name, backend in backends:

                def make(b=b, h=h, n=n, d=d, group=group):
                    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    kv = [torch.randn(b, h // group, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
                    k, v = (t.repeat_interleave(group, dim=1).requires_grad_() for t in kv)
                    return [q, k, v]

                def fwd(q, k, v, backend=backend, causal=causal):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def make_bwd(make=make, fwd=fwd):
                    q, k, v = make()
                    o = fwd(q, k, v)
                    return o, torch.randn_like(o), (q, k, v)

                def bwd(o, g, inputs):
                    return torch.autograd.grad(o, inputs, g, retain_graph=True)

                yield f"attention fwd {name}", shape, make, fwd
                if d <= 128 or (d == 256 and (n, causal) in d256_bwd):
                    yield f"attention bwd {name}", shape, make_bwd, bwd


_PAD = None


def _pad():
    """Untimed work before each timed run, as calico-bench's `timing::Pad`: a read-only
    matrix-vector product over 512 MiB, which evicts the L2 and leaves it clean (a copy or a
    memset, as triton's do_bench flush, leaves dirty lines that the timed run writes back) and
    keeps the stream busy while the host queues the timed work."""
    global _PAD
    if _PAD is None:
        k = 16384
        _PAD = (torch.zeros(1, k, device="cuda", dtype=torch.bfloat16),
                torch.zeros(k, k, device="cuda", dtype=torch.bfloat16))
    x, w = _PAD
    torch.nn.functional.linear(x, w)


def bench(fn, min_runs=20, max_runs=200, soft_cap_ms=300.0):
    """Median device-event time (ms) of `fn`, each run after the pad, after a warm-up."""
    import time

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    started = time.perf_counter()
    while len(times) < max_runs:
        _pad()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        spent = (time.perf_counter() - started) * 1e3
        if len(times) >= min_runs and spent > soft_cap_ms:
            break
    times.sort()
    return times[len(times) // 2]


def norm_cases(cols_list):
    F = torch.nn.functional
    for cols in cols_list:
        shape = [ROWS, cols]

        def make(cols=cols):
            x = torch.randn(ROWS, cols, device="cuda", dtype=torch.bfloat16)
            r = torch.randn_like(x)
            w = torch.rand(cols, device="cuda", dtype=torch.bfloat16) + 0.5
            b = torch.rand(cols, device="cuda", dtype=torch.bfloat16) - 0.5
            return x, r, w, b

        yield "rms_norm", shape, make, lambda x, r, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6)
        yield "layer_norm", shape, make, lambda x, r, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
        # torch has no fused residual norm: add, then norm (two kernels).
        yield "add_rms_norm", shape, make, lambda x, r, w, b: F.rms_norm(x + r, (x.shape[-1],), w, 1e-6)
        yield "add_layer_norm", shape, make, lambda x, r, w, b: F.layer_norm(x + r, (x.shape[-1],), w, b, 1e-5)


def decode_cases(shapes):
    """torch SDPA on decode shapes, once per backend (cuDNN, flash), GQA through enable_gqa."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    for shape in shapes:
        batch, context = shape[:2]
        d = shape[2] if len(shape) > 2 else 128

        def make(batch=batch, context=context, d=d):
            q = torch.randn(batch, 32, 1, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch, 8, context, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            return q, k, v

        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):

            def fn(q, k, v, backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

            yield {"op": "attention_decode", "shape": list(shape), "backend": name, "dtype": "bf16"}, make, fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="peers.json")
    ap.add_argument("--quick", action="store_true", help="the shapes of calico-bench --quick")
    ap.add_argument("--only", default=None,
                    help="only cases whose calico-bench name contains one of these comma-separated parts")
    args = ap.parse_args()
    parts = [p for p in (args.only or "").split(",") if p]

    def wanted(name):
        return not parts or any(p in name for p in parts)

    if not torch.cuda.is_available():
        print("peers.py: no CUDA device", file=sys.stderr)
        return 1
    norm_cols, softmax_cols, gemms, decodes = NORM_COLS, SOFTMAX_COLS, GEMMS, DECODES
    if args.quick:
        norm_cols, softmax_cols = [4096], [4096]
        gemms = [(4096, 4096, 4096), (8192, 14336, 4096), (64, 4096, 4096)]
        decodes = [(1, 32768)]
    results = []

    def record(entry, make, fn):
        try:
            inputs = make()
            entry["median_ms"] = bench(lambda: fn(*inputs))
        except Exception as e:  # noqa: BLE001 - a failing peer must not stop the others
            entry["error"] = f"{type(e).__name__}: {e}"
        finally:
            torch.cuda.empty_cache()
        results.append(entry)
        print(json.dumps(entry), flush=True)

    def dims(shape):
        return "x".join(str(d) for d in shape)

    for op, shape, make, fn in norm_cases(norm_cols):
        if wanted(f"{op} bf16 {dims(shape)}"):
            record({"op": op, "shape": shape, "dtype": "bf16"}, make, fn)
    for cols in softmax_cols:
        if not wanted(f"softmax bf16 {ROWS}x{cols}"):
            continue
        make = lambda cols=cols: (torch.randn(ROWS, cols, device="cuda", dtype=torch.bfloat16) * 2,)
        record({"op": "softmax", "shape": [ROWS, cols], "dtype": "bf16"}, make, lambda x: torch.softmax(x, -1))
    rows, cols = ODD_ROWS
    make_odd = lambda: (torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 2,
                        torch.rand(cols, device="cuda", dtype=torch.bfloat16) + 0.5)
    if wanted(f"softmax odd bf16 {rows}x{cols}"):
        record({"op": "softmax", "shape": [rows, cols], "dtype": "bf16"}, make_odd, lambda x, w: torch.softmax(x, -1))
    if wanted(f"rms_norm odd bf16 {rows}x{cols}"):
        F = torch.nn.functional
        record({"op": "rms_norm", "shape": [rows, cols], "dtype": "bf16"}, make_odd,
               lambda x, w: F.rms_norm(x, (cols,), w, 1e-6))

    def operands(m, n, k):
        # A [M, K] and a weight W [N, K], as torch Linear and calico-bench do.
        return lambda: (
            torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
        )

    for entry, make, fn in decode_cases(decodes):
        batch, context = entry["shape"][:2]
        dim = f" d{entry['shape'][2]}" if len(entry["shape"]) > 2 else ""
        if wanted(f"attention decode bf16 b{batch} ctx{context} contiguous{dim}"):
            record(entry, make, fn)
    for m, n, k in gemms:
        if wanted(f"gemm {m}x{n}x{k}"):
            record({"op": "gemm", "m": m, "n": n, "k": k, "dtype": "bf16"}, operands(m, n, k),
                   lambda a, w: torch.matmul(a, w.t()))
    for m, n, k in [] if args.quick else GEMVS:
        if wanted(f"gemv {m}x{n}x{k}"):
            record({"op": "linear", "m": m, "n": n, "k": k, "dtype": "bf16"}, operands(m, n, k),
                   lambda a, w: torch.nn.functional.linear(a, w))
    for m, n, k in ODD_GEMMS[:1] if args.quick else ODD_GEMMS:
        if wanted(f"gemm odd {m}x{n}x{k}"):
            record({"op": "matmul", "m": m, "n": n, "k": k, "dtype": "bf16"}, operands(m, n, k),
                   lambda a, w: torch.matmul(a, w.t()))
    if wanted("launch overhead") or wanted("graph replay"):
        for entry in host_loops.run():
            results.append(entry)
            print(json.dumps(entry), flush=True)
    attn_seqs = [1024, 4096] if args.quick else ATTN_SEQS
    d256_bwd = ATTN_D256_BWD_QUICK if args.quick else ATTN_D256_BWD
    for op, shape, make, fn in attention_cases(attn_seqs, d256_bwd):
        # calico-bench's name of the case ("attention fwd d128 N2048 causal"), or the peer's op.
        b, h, n, d, causal = shape[:5]
        gqa = f" gqa{h // shape[5]}" if len(shape) > 5 else ""
        name = f"attention {op.split()[1]} d{d} N{n}{' causal' if causal else ''}{gqa}"
        if wanted(name) or wanted(op):
            with torch.no_grad() if " fwd " in op else torch.enable_grad():
                record({"op": op, "shape": shape, "dtype": "bf16"}, make, fn)
    out = {
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"peers.py: wrote {args.out} ({sum('median_ms' in r for r in results)} of {len(results)} cases timed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
