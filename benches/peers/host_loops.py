"""Host-loop peers for calico-bench's "launch overhead" and "graph replay" cases (imported by
peers.py): the same loops in PyTorch eager, timed on the host as calico-bench times them."""
import statistics
import time

import torch

F = torch.nn.functional

# (op, shape) exactly as benches/src/cases/host_loop.rs names them.
LOOPS = [
    ("rms_norm", [8, 4096]),
    ("softmax", [8, 4096]),
    ("rope", [8, 1, 32, 128]),
    ("matmul", [1000, 1000, 1000]),
    ("matmul", [257, 129, 1000]),
    ("matmul", [16, 4096, 4096]),
    ("attention_decode", [1, 32, 8, 4096, 128]),  # B, Hq, Hkv, context, D; one query
    ("attention", [1, 32, 8, 128, 128]),  # B, Hq, Hkv, N, D; causal
    # host_loop.rs's "attention_varlen" and "attention_backward" loops have no torch peer on
    # purpose: the report shows them with Calico's time only.
]
DECODE_STEP = [16, 4096, 8]  # tokens, hidden, kv heads (head_dim 128)


def bf16(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def rope_half_split(x, cos, sin):
    # x [B, S, H, D]; cos/sin [S, D/2] broadcast over batch and heads (several torch kernels).
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def make_call(op, shape):
    if op == "rms_norm":
        x, w = bf16(*shape), bf16(shape[1])
        return lambda: F.rms_norm(x, (shape[1],), w, 1e-6)
    if op == "softmax":
        x = bf16(*shape)
        return lambda: torch.softmax(x, -1)
    if op == "rope":
        x = bf16(*shape)
        cos, sin = bf16(shape[1], shape[3] // 2), bf16(shape[1], shape[3] // 2)
        return lambda: rope_half_split(x, cos, sin)
    if op == "matmul":
        m, n, k = shape
        a, w = bf16(m, k), bf16(n, k)
        return lambda: F.linear(a, w)
    if op in ("attention_decode", "attention"):
        b, hq, hkv, n, d = shape
        q = bf16(b, hq, 1 if op == "attention_decode" else n, d)
        k, v = bf16(b, hkv, n, d), bf16(b, hkv, n, d)
        causal = op == "attention"
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    raise ValueError(op)


def median_call_us(fn, calls=1000, loops=5):
    """The lowest of `loops` loops' median host time per call (calico-bench's host_loop.rs:
    best_loop): the GPU machine's CPU is shared, so one loop can read 2-3x another."""
    best = None
    for _ in range(loops):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(calls):
            t = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t) / 1e3)
        torch.cuda.synchronize()
        median = statistics.median(samples)
        best = median if best is None else min(best, median)
    return best


def decode_step_fn(tokens, hidden, kv_heads):
    hd = 128
    heads, kv = hidden // hd, kv_heads * hd
    x, res, w = bf16(tokens, hidden), bf16(tokens, hidden), bf16(hidden)
    wq, wk, wv = bf16(hidden, hidden), bf16(kv, hidden), bf16(kv, hidden)
    cos, sin = bf16(1, hd // 2), bf16(1, hd // 2)

    def step():
        s = x + res
        y = F.rms_norm(s, (hidden,), w, 1e-6)
        q, k, v = F.linear(y, wq), F.linear(y, wk), F.linear(y, wv)
        qr = rope_half_split(q.view(tokens, 1, heads, hd), cos, sin)
        kr = rope_half_split(k.view(tokens, 1, kv_heads, hd), cos, sin)
        return torch.softmax(qr.reshape(tokens * heads, hd), -1), kr, v, s

    return step


def per_step_us(fn, steps=200):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter_ns()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t) / 1e3 / steps


def run():
    """Yields peers.py result entries (median_ms holds the host time per call or step)."""
    for op, shape in LOOPS:
        entry = {"op": f"host_{op}", "shape": shape, "dtype": "bf16"}
        try:
            entry["median_ms"] = median_call_us(make_call(op, shape)) / 1e3
        except Exception as e:  # noqa: BLE001 - a failing peer must not stop the others
            entry["error"] = f"{type(e).__name__}: {e}"
        yield entry
    step = decode_step_fn(*DECODE_STEP)
    entry = {"op": "decode_step_eager", "shape": DECODE_STEP, "dtype": "bf16"}
    try:
        entry["median_ms"] = per_step_us(step) / 1e3
    except Exception as e:  # noqa: BLE001
        entry["error"] = f"{type(e).__name__}: {e}"
    yield entry
    entry = {"op": "decode_step_graph", "shape": DECODE_STEP, "dtype": "bf16"}
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        entry["median_ms"] = per_step_us(graph.replay) / 1e3
    except Exception as e:  # noqa: BLE001
        entry["error"] = f"{type(e).__name__}: {e}"
    yield entry
