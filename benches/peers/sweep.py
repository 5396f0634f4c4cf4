"""A sweep of shapes a user meets, timed on the host in PyTorch and compared with calico-sweep.

    python3 benches/peers/sweep.py cases OUT.json [--seed N]   # write the case list
    python3 benches/peers/sweep.py torch CASES.json > torch.jsonl   # time torch on it (GPU)
    python3 benches/peers/sweep.py compare CASES.json calico.jsonl torch.jsonl

Both sides time each case the same way (benches/src/bin/calico-sweep.rs): warm-up calls, then
the best of five loops of calls queued back to back and closed by one synchronisation, so the
figure is what a program calling the op in a loop sees per call (host overhead included).
The case list mixes the shapes that sit on routing boundaries (M around 16, 64, 128; odd K and
N; rows that are not multiples of 8) with model shapes; no case carries a target.
"""
import json
import random
import sys
import time

MATMUL_M = [1, 2, 3, 5, 8, 12, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 200,
            255, 256, 257, 384, 500, 512, 777, 1000, 1024, 1500, 2048, 3000, 4096, 8192]
MATMUL_NK = [64, 128, 256, 511, 512, 768, 1000, 1024, 1536, 2048, 2560, 3072, 4095, 4096, 5120,
             6144, 8192, 11008, 14336]
ROWS = [1, 7, 64, 1000, 4096, 16384, 65536]
COLS = [64, 100, 128, 1000, 4096, 4097, 8192, 16384, 32000, 128256]


def make_cases(seed):
    rng = random.Random(seed)
    cases = []

    def add(op, **kw):
        cases.append(dict(id=f"{op}-{len(cases)}", op=op, **kw))

    for _ in range(110):
        m, n, k = rng.choice(MATMUL_M), rng.choice(MATMUL_NK), rng.choice(MATMUL_NK)
        add("matmul", m=m, n=n, k=k, batch=0, b="linear")
    for _ in range(25):
        m, n, k = rng.choice(MATMUL_M), rng.choice(MATMUL_NK), rng.choice(MATMUL_NK)
        add("matmul", m=m, n=n, k=k, batch=0, b="rowmajor")
    for _ in range(20):
        batch = rng.choice([2, 8, 32, 128, 512])
        m, n, k = (rng.choice([16, 64, 100, 128, 256, 512]) for _ in range(3))
        add("matmul", m=m, n=n, k=k, batch=batch, b=rng.choice(["linear", "rowmajor"]))
    for op in ("rms_norm", "softmax"):
        for _ in range(18):
            rows, cols = rng.choice(ROWS), rng.choice(COLS)
            if rows * cols > 2**30:
                continue
            add(op, rows=rows, cols=cols)
    for backward in (False, True):
        for _ in range(45 if not backward else 25):
            hq = rng.choice([8, 16, 32])
            hkv = hq // rng.choice([1, 4, 8])
            d = rng.choice([64, 80, 96, 128, 256] if not backward else [64, 96, 128, 256])
            n = rng.choice([1, 17, 100, 128, 500, 1000, 1024, 2048, 3000, 4096, 8192])
            b = rng.choice([1, 2, 4, 8])
            causal = rng.random() < 0.5
            nkv = n
            if not causal and rng.random() < 0.3:
                nkv = rng.choice([128, 1000, 4096])
            if b * hq * n * nkv * d > 2**38:
                b = 1
            if b * hq * n * nkv * d > 2**38:
                continue
            add("attention_backward" if backward else "attention", b=b, hq=hq, hkv=hkv, nq=n,
                nkv=nkv, d=d, causal=causal)
    for _ in range(24):
        hq, hkv = rng.choice([(32, 8), (32, 32), (64, 8), (16, 2)])
        add("attention_decode", b=rng.choice([1, 4, 16, 64]), hq=hq, hkv=hkv,
            ctx=rng.choice([100, 1000, 4096, 32768]), d=rng.choice([64, 128, 256]),
            nq=rng.choice([1, 1, 4]), causal=False)
    return cases


def torch_call(c):
    import torch

    F = torch.nn.functional

    def t(*shape):
        return torch.rand(*shape, device="cuda", dtype=torch.bfloat16) * 2 - 1

    op = c["op"]
    if op == "matmul":
        lead = [c["batch"]] if c["batch"] else []
        a = t(*lead, c["m"], c["k"])
        if c["b"] == "rowmajor":
            b = t(*lead, c["k"], c["n"])
            return lambda: torch.matmul(a, b)
        w = t(*lead, c["n"], c["k"])
        return (lambda: F.linear(a, w)) if not lead else (lambda: torch.matmul(a, w.transpose(1, 2)))
    if op == "rms_norm":
        x, w = t(c["rows"], c["cols"]), t(c["cols"])
        return lambda: F.rms_norm(x, (c["cols"],), w, 1e-6)
    if op == "softmax":
        x = t(c["rows"], c["cols"])
        return lambda: torch.softmax(x, -1)
    if op in ("attention", "attention_backward", "attention_decode"):
        nq = c["nq"]
        nkv = c["ctx"] if op == "attention_decode" else c["nkv"]
        q = t(c["b"], c["hq"], nq, c["d"])
        k, v = t(c["b"], c["hkv"], nkv, c["d"]), t(c["b"], c["hkv"], nkv, c["d"])
        causal = c["causal"]
        if op != "attention_backward":
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        for x in (q, k, v):
            x.requires_grad_(True)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        d_o = torch.randn_like(o)
        return lambda: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True)
    raise ValueError(op)


def time_call(call):
    import torch

    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    once = time.perf_counter() - start
    calls = min(200, max(3, int(0.02 / max(once, 1e-6))))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def run_torch(path):
    import torch

    for c in json.load(open(path)):
        try:
            line = {"id": c["id"], "us": time_call(torch_call(c))}
        except Exception as e:  # an unsupported shape is reported, not fatal
            line = {"id": c["id"], "error": f"{type(e).__name__}: {e}"[:200]}
        torch.cuda.empty_cache()
        print(json.dumps(line), flush=True)


def describe(c):
    keys = [k for k in ("batch", "m", "n", "k", "b", "rows", "cols", "hq", "hkv", "nq", "nkv", "ctx",
                        "d", "causal") if k in c]
    return " ".join(f"{k}={c[k]}" for k in keys)


def compare(cases_path, calico_path, torch_path):
    cases = {c["id"]: c for c in json.load(open(cases_path))}
    def read(path):
        # Only the JSON lines: the GPU bundle's runner prints the device list first.
        lines = (line for line in open(path) if line.startswith("{"))
        return {r["id"]: r for r in map(json.loads, lines) if r.get("id")}

    cal, tor = read(calico_path), read(torch_path)
    rows = []
    for cid, c in cases.items():
        a, b = cal.get(cid, {}), tor.get(cid, {})
        ratio = b["us"] / a["us"] if "us" in a and "us" in b else None
        rows.append((ratio, cid, c, a, b))
    rows.sort(key=lambda r: (r[0] is None, r[0] if r[0] is not None else 0))
    print("| torch / calico | calico us | torch us | case |")
    print("| ---: | ---: | ---: | --- |")
    for ratio, cid, c, a, b in rows:
        fa = f"{a['us']:.1f}" if "us" in a else a.get("error", "missing")[:60]
        fb = f"{b['us']:.1f}" if "us" in b else b.get("error", "missing")[:60]
        fr = f"{ratio:.2f}" if ratio is not None else "-"
        print(f"| {fr} | {fa} | {fb} | {c['op']} {describe(c)} |")
    ratios = [r[0] for r in rows if r[0] is not None]
    if ratios:
        slow = sum(1 for r in ratios if r < 0.8)
        print(f"\n{len(ratios)} cases timed on both; {slow} where Calico is more than 1.25x slower")


def main(argv):
    if len(argv) >= 3 and argv[1] == "cases":
        seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 1
        json.dump(make_cases(seed), open(argv[2], "w"), indent=0)
    elif len(argv) == 3 and argv[1] == "torch":
        run_torch(argv[2])
    elif len(argv) == 5 and argv[1] == "compare":
        compare(argv[2], argv[3], argv[4])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
