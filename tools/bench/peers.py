"""clattn against the attention a CPU user would pick instead, side by side.

    python peers.py --shape S [--shape S...] [--peer torch|openvino] [--cap SECONDS]
        times the peers on each shape S = H,HKV,M,N,D[,causal]; one JSON
        line per peer and shape: {"peer", "shape", "ms", "gflops", "note"}
    python peers.py --rounds R --clattn CLATTN [--runtime pocl|intel]... [--shape S...]
                    [--write FILE]
        R alternating rounds; in each, every contender once over all shapes,
        each in a process of its own (the order turns each round): `clattn
        bench` (FUSED) on each runtime, then the peers. Prints the table
        (markdown), and with --write puts it between the peers:begin and
        peers:end markers of FILE.

tools/scripts/peers.sh runs it in the venv it makes from PyPI. FLOPs are
counted as clattn bench counts them: 4*B*H*M*N*D per call, halved under
causal. Inputs are f32, batch 1; each peer computes in f32 on every core.

- torch: torch.nn.functional.scaled_dot_product_attention (its fused
  flash-attention CPU kernel), grouped-query heads through enable_gqa.
- openvino: an opset-13 ScaledDotProductAttention model compiled for the
  CPU plugin with f32 inference precision (its default on CPUs with bf16
  would round the inputs); its SDPA takes as many K/V heads as query
  heads, so grouped K/V are repeated to the query heads before the call
  (note "MHA").
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time


def parse_shape(text):
    parts = text.split(",")
    if len(parts) not in (5, 6) or (len(parts) == 6 and parts[5] != "causal"):
        raise argparse.ArgumentTypeError("--shape H,HKV,M,N,D[,causal]")
    h, hkv, m, n, d = (int(x) for x in parts[:5])
    if min(h, hkv, m, n, d) < 1 or h % hkv:
        raise argparse.ArgumentTypeError("--shape: positive sizes, HKV dividing H")
    return {"H": h, "HKV": hkv, "M": m, "N": n, "D": d, "causal": len(parts) == 6}


def gflops(s, ms):
    flops = 4.0 * s["H"] * s["M"] * s["N"] * s["D"]
    if s["causal"]:
        flops /= 2
    return flops / (ms * 1e6)


def timed(call, cap):
    """Median milliseconds of call() over at least 3 calls and about cap seconds, after one warm-up."""
    call()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < cap and len(times) < 1000):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def inputs(s, rng):
    import numpy as np

    q = rng.standard_normal((1, s["H"], s["M"], s["D"]), dtype=np.float32)
    k = rng.standard_normal((1, s["HKV"], s["N"], s["D"]), dtype=np.float32)
    v = rng.standard_normal((1, s["HKV"], s["N"], s["D"]), dtype=np.float32)
    return q, k, v


def run_torch(s, q, k, v, cap):
    import torch

    torch.set_num_threads(os.cpu_count())
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    gqa = s["HKV"] != s["H"]

    def call():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=s["causal"], enable_gqa=gqa)

    return timed(call, cap), "torch %s, %d threads" % (torch.__version__, torch.get_num_threads())


def run_openvino(s, q, k, v, cap):
    import numpy as np
    import openvino as ov

    try:
        import openvino.opset13 as ops
    except ImportError:  # releases before 2024.2
        import openvino.runtime.opset13 as ops

    if s["HKV"] != s["H"]:  # its SDPA wants K/V heads matching the query heads
        k = np.repeat(k, s["H"] // s["HKV"], axis=1)
        v = np.repeat(v, s["H"] // s["HKV"], axis=1)
    params = [ops.parameter(list(x.shape), ov.Type.f32) for x in (q, k, v)]
    out = ops.scaled_dot_product_attention(*params, causal=s["causal"])
    model = ov.Model([out], params)
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    feed = {i: x for i, x in enumerate((q, k, v))}
    note = "openvino %s" % ov.get_version().split("-")[0]
    if s["HKV"] != s["H"]:
        note += ", MHA"
    return timed(lambda: request.infer(feed), cap), note


PEERS = {"torch": run_torch, "openvino": run_openvino}  # in the order the table shows them


DEFAULT_SHAPES = [
    "8,8,1024,1024,64",  # prefill
    "8,8,2048,2048,64,causal",
    "16,4,1024,1024,128",  # grouped-query heads
    "8,8,1024,1024,256",
    "32,8,1,8192,128",  # decode
    "32,8,1,32768,128",
]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# clattn bench's text columns after the shape (tools/bench/bench.c, col_txt)
BENCH_COLS = ["auto", "fused", "fused ms", "f16", "bf16", "staged", "f/stg", "host", "f/host", "%devmm", "%hostmm",
              "GB/s", "%copy"]


def shape_text(s):
    return "%d,%d,%d,%d,%d%s" % (s["H"], s["HKV"], s["M"], s["N"], s["D"], ",causal" if s["causal"] else "")


def shape_label(s):
    """clattn bench's label of a --shape row (bench.c, shape_label)."""
    kind = "decode" if s["M"] <= 16 else "GQA" if s["H"] != s["HKV"] else "prefill"
    heads = "H%d" % s["H"] if s["H"] == s["HKV"] else "H%d/%d" % (s["H"], s["HKV"])
    size = "M=N=%d" % s["N"] if s["M"] == s["N"] else "M=%d N=%d" % (s["M"], s["N"])
    return "%s %s %s d%d%s" % (kind, heads, size, s["D"], " causal" if s["causal"] else "")


def run_clattn(clattn, runtime, shapes, cap):
    """FUSED GFLOP/s and %copy per shape from one `clattn bench` on runtime."""
    cmd = [clattn, "bench", "--no-staged", "--no-host", "--no-check", "--reps", "10", "--cap", str(cap)]
    for s in shapes:
        cmd += ["--shape", shape_text(s)]
    env = dict(os.environ)
    if runtime == "intel":
        cmd = [os.path.join(ROOT, "tools/scripts/intel-runtime.sh")] + cmd
    else:
        env.setdefault("POCL_WORK_GROUP_METHOD", "loopvec")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), out.returncode, out.stderr[-500:]))
    rows = {}
    for line in out.stdout.splitlines():
        for s in shapes:
            label = shape_label(s)
            if line.startswith(label + "  "):
                row = dict(zip(BENCH_COLS, line[len(label):].split()))
                rows[shape_text(s)] = (to_float(row.get("fused")), to_float(row.get("%copy", "").rstrip("%")))
    missing = [shape_label(s) for s in shapes if shape_text(s) not in rows]
    if missing:  # bench.c's labels or columns changed: say so rather than print a table of gaps
        raise RuntimeError("clattn bench printed no row for %s" % ", ".join(missing))
    # "ceilings: device CLBlast SGEMM ..., host OpenBLAS SGEMM 2048^3 X GFLOP/s, device copy ...": the host's
    # matrix-product rate, the ceiling every contender's two products per key block share
    sgemm = re.search(r"host OpenBLAS SGEMM \S+ ([0-9.]+) GFLOP/s", out.stdout)
    if sgemm:
        rows["sgemm"] = (float(sgemm.group(1)), None)
    # "..., device FMA peak X GFLOP/s": the CPU's arithmetic ceiling, the same for every contender
    fma = re.search(r"device FMA peak ([0-9.]+) GFLOP/s", out.stdout)
    if fma:
        rows["fma"] = (float(fma.group(1)), None)
    # "opencl: PLATFORM (VERSION); device NAME (...), driver D" -> "PLATFORM VERSION, driver D"
    line = next((l for l in out.stdout.splitlines() if l.startswith("opencl:")), "")
    m = re.match(r"opencl: (.*?) \((OpenCL [^)]*?)\).*driver (\S+)", line)
    return rows, "%s (%s), driver %s" % m.groups() if m else line


def to_float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def run_peer(peer, shapes, cap):
    cmd = [sys.executable, os.path.abspath(__file__), "--peer", peer, "--cap", str(cap)]
    for s in shapes:
        cmd += ["--shape", shape_text(s)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    rows, note = {}, ""
    for line in out.stdout.splitlines():
        r = json.loads(line)
        rows[shape_text(r["shape"])] = (r["gflops"], None)
        note = r["note"] if r["gflops"] is not None else note or r["note"]
    return rows, note


def machine():
    model, flags = "", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    ext = [x for x in ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16", "avx2", "fma")
           if x in flags]
    return "%s, %d logical CPUs; %s" % (model, os.cpu_count(), ", ".join(ext) or "no AVX2")


def spread(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return "–"
    med = statistics.median(v)
    return "%.1f" % med if v[0] == v[-1] else "%.1f (%.1f–%.1f)" % (med, v[0], v[-1])


def percent(values, peak):
    """The median of values as a share of peak."""
    v = [x for x in values if x is not None]
    return "%.0f %%" % (100.0 * statistics.median(v) / peak) if v else "–"


def ratios(a, b):
    """Per-round ratios a/b (the rounds pair up: each ran every contender once)."""
    r = [x / y for x, y in zip(a, b) if x and y]
    if not r:
        return "–"
    return "%.2f×" % statistics.median(r) if len(r) == 1 else "%.2f× (%.2f–%.2f)" % (
        statistics.median(r), min(r), max(r))


def compare(args):
    contenders = ["clattn " + rt for rt in args.runtime] + (args.peer or list(PEERS))
    results = {c: [] for c in contenders}  # per round: {shape: (gflops, %copy)}
    notes, load = {}, [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        for c in order:
            if c.startswith("clattn "):
                rows, notes[c] = run_clattn(args.clattn, c.split()[1], args.shape, args.cap)
            else:
                rows, notes[c] = run_peer(c, args.shape, args.cap)
            results[c].append(rows)
            print("round %d/%d: %s done" % (r + 1, args.rounds, c), file=sys.stderr, flush=True)
        load.append(os.getloadavg()[0])
    lines = [
        "%s, %s; %d alternating rounds (`tools/scripts/peers.sh --rounds %d`), load average %.1f–%.1f."
        % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine(), args.rounds, args.rounds, min(load),
           max(load)),
        "",
    ]
    for c in contenders:
        lines.append("- %s: %s" % (c, notes.get(c, "")))
    sgemm = [rows["sgemm"][0] for c in contenders if c.startswith("clattn ") for rows in results[c] if "sgemm" in rows]
    if sgemm:
        lines.append("- the host's OpenBLAS SGEMM (2048³, measured by each `clattn bench` run): %s GFLOP/s" % spread(sgemm))
    fma = [rows["fma"][0] for c in contenders if c.startswith("clattn ") for rows in results[c] if "fma" in rows]
    peak = statistics.median(fma) if fma else None
    if fma:
        lines.append("- the CPU's FMA peak (float multiply-add chains in OpenCL, measured by each `clattn bench` run): "
                     "%s GFLOP/s; the %% of FMA peak columns take its median" % spread(fma))
    lines.append("")
    head = ["shape"] + ["%s GFLOP/s" % c for c in contenders]
    head += ["%s %% of FMA peak" % c for c in contenders] if peak else []
    head += ["clattn %s ÷ %s" % (rt, p) for rt in args.runtime for p in (args.peer or list(PEERS))]
    head += ["clattn %s %% of copy BW" % rt for rt in args.runtime]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in args.shape:
        key = shape_text(s)
        per = {c: [rows.get(key, (None, None)) for rows in results[c]] for c in contenders}
        cells = [shape_label(s)]
        cells += [spread([g for g, _ in per[c]]) for c in contenders]
        if peak:
            cells += [percent([g for g, _ in per[c]], peak) for c in contenders]
        for rt in args.runtime:
            for p in (args.peer or list(PEERS)):
                cells.append(ratios([g for g, _ in per["clattn " + rt]], [g for g, _ in per[p]]))
        cells += [spread([pc for _, pc in per["clattn " + rt]]) if s["M"] == 1 else "–" for rt in args.runtime]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    print(table)
    return write_between(args.write, "peers", table) if args.write else 0


def write_between(path, name, table):
    """Puts table between the NAME:begin and NAME:end markers of the page at path."""
    with open(path) as f:
        text = f.read()
    begin, end = "<!-- %s:begin -->\n" % name, "<!-- %s:end -->" % name
    if begin not in text or end not in text:
        print("%s: %s has no %s / %s markers" % (name, path, begin.strip(), end), file=sys.stderr)
        return 1
    a, b = text.index(begin) + len(begin), text.index(end)
    with open(path, "w") as f:
        f.write(text[:a] + table + text[b:])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=parse_shape, action="append")
    ap.add_argument("--peer", choices=sorted(PEERS), action="append")
    ap.add_argument("--cap", type=float, default=2.0, help="seconds per contender and shape (default 2)")
    ap.add_argument("--rounds", type=int, help="compare clattn with the peers over this many rounds")
    ap.add_argument("--clattn", help="the clattn tool (with --rounds)")
    ap.add_argument("--runtime", choices=["pocl", "intel"], action="append", help="with --rounds (default pocl)")
    ap.add_argument("--write", help="with --rounds: the page to put the table in")
    args = ap.parse_args()
    args.shape = args.shape or [parse_shape(x) for x in DEFAULT_SHAPES]
    if args.rounds:
        if not args.clattn:
            ap.error("--rounds needs --clattn")
        args.runtime = args.runtime or ["pocl"]
        return compare(args)
    import numpy as np

    rng = np.random.default_rng(1)
    status = 0
    for s in args.shape:
        q, k, v = inputs(s, rng)
        for name in args.peer or list(PEERS):
            row = {"peer": name, "shape": s}
            try:
                ms, note = PEERS[name](s, q, k, v, args.cap)
                row.update(ms=round(ms, 4), gflops=round(gflops(s, ms), 2), note=note)
            except Exception as e:  # a peer missing or failing is reported, not fatal for the others
                row.update(ms=None, gflops=None, note="failed: %s: %s" % (type(e).__name__, e))
                status = 1
            print(json.dumps(row), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
