"""clattn's modifiers against PyTorch's compiled flex_attention, side by side.

    python peers_flex.py --torch [--n N] [--cap SECONDS]
        times torch.compile(flex_attention) on the three cases below; one
        JSON line per case: {"case", "ms", "note"}
    python peers_flex.py --rounds R --clattn CLATTN [--n N] [--write FILE]
        R alternating rounds, each running `clattn bench --modifiers` (POCL)
        and the torch timings in processes of their own (the order turns
        each round); prints the table, and with --write puts it between the
        flex:begin and flex:end markers of FILE.

The cases, f32, B 1, H 8, M = N (4096), d 64, as `clattn bench --modifiers`
runs them: 8 equal documents (a document mask with its block mask), causal
as a mask with its block mask, and ALiBi as a score modifier (slopes
2^(-8 (h + 1) / H) captured). Both sides use blocks of 128. torch computes
on every core; its flex_attention is compiled by TorchInductor's CPU
backend (a C++ compiler at run time). tools/scripts/peers.sh --flex runs it
in the venv it makes from PyPI.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import machine, timed, write_between  # noqa: E402

H, D, DOCS = 8, 64, 8
CASES = ("documents", "causal", "alibi")
# `clattn bench --modifiers` line labels for each case
CLATTN_LABELS = {"documents": "document mask modifier + block mask", "causal": "causal mask modifier + block mask",
                 "alibi": "ALiBi score modifier"}
BUILTIN_LABELS = {"documents": "dense mask tensor [N, N]", "causal": "built-in causal", "alibi": "built-in ALiBi"}


def flops(case, n):
    full = 4.0 * H * n * n * D
    return full / DOCS if case == "documents" else full / 2 if case == "causal" else full


def run_torch(n, cap):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(1)
    q, k, v = (torch.rand(1, H, n, D) - 0.5 for _ in range(3))
    doc = torch.arange(n) // (n // DOCS)
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, dtype=torch.float32) / H)

    def document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    flex = torch.compile(flex_attention)
    calls = {
        "documents": dict(block_mask=create_block_mask(document, None, None, n, n, device="cpu")),
        "causal": dict(block_mask=create_block_mask(causal, None, None, n, n, device="cpu")),
        "alibi": dict(score_mod=alibi),
    }
    note = "torch %s, torch.compile(flex_attention), %d threads" % (torch.__version__, torch.get_num_threads())
    for case in CASES:
        try:
            with torch.no_grad():
                ms = timed(lambda: flex(q, k, v, **calls[case]), cap)
            print(json.dumps({"case": case, "ms": ms, "note": note}), flush=True)
        except Exception as e:  # a compiler missing or refusing: report it, as a peer that did not run
            print(json.dumps({"case": case, "ms": None, "note": "%s: %s" % (type(e).__name__, e)}), flush=True)


def clattn_round(clattn, n):
    env = dict(os.environ)
    env.setdefault("POCL_WORK_GROUP_METHOD", "loopvec")
    cmd = [clattn, "bench", "--modifiers", "--shape", "%d,%d,%d,%d" % (H, H, n, D), "--reps", "5"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), out.returncode, out.stderr[-500:]))
    ms = {}
    for line in out.stdout.splitlines():
        for case in CASES:
            for kind, labels in (("clattn", CLATTN_LABELS), ("builtin", BUILTIN_LABELS)):
                if line.strip().startswith(labels[case] + " "):
                    ms[(kind, case)] = float(line.split(labels[case])[1].split()[0])
    return ms


def torch_round(n, cap):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch", "--n", str(n), "--cap", str(cap)],
                         capture_output=True, text=True)
    ms, note = {}, out.stderr.strip()[-300:]
    for line in out.stdout.splitlines():
        r = json.loads(line)
        ms[("torch", r["case"])] = r["ms"]
        note = r["note"]
    return ms, note


def median_text(values, fmt="%.1f"):
    v = sorted(x for x in values if x)
    if not v:
        return "–"
    return fmt % statistics.median(v) if len(v) == 1 else (fmt + " (" + fmt + "–" + fmt + ")") % (
        statistics.median(v), v[0], v[-1])


def compare(args):
    rounds, note, load = [], "", [os.getloadavg()[0]]
    for r in range(args.rounds):
        ms = {}
        steps = [lambda: clattn_round(args.clattn, args.n), lambda: torch_round(args.n, args.cap)]
        for step in steps[r % 2:] + steps[:r % 2]:
            got = step()
            if isinstance(got, tuple):
                got, note = got
            ms.update(got)
        rounds.append(ms)
        load.append(os.getloadavg()[0])
        print("round %d/%d done" % (r + 1, args.rounds), file=sys.stderr, flush=True)
    lines = ["%s, %s; %d alternating rounds (`tools/scripts/peers.sh --flex --rounds %d`), load average %.1f–%.1f."
             % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine(), args.rounds, args.rounds, min(load),
                max(load)), "",
             "- clattn: `clattn bench --modifiers` on POCL (FUSED, blocks of 128)", "- torch: %s" % note, "",
             "B 1, H 8, M = N = %d, d 64, f32. GFLOP/s count the pairs each case allows." % args.n, "",
             "| case | clattn GFLOP/s | torch flex_attention GFLOP/s | clattn ÷ torch | clattn's built-in equivalent GFLOP/s |",
             "| --- | --- | --- | --- | --- |"]
    for case in CASES:
        f = flops(case, args.n)
        gf = {kind: [f / (r[(kind, case)] * 1e6) if r.get((kind, case)) else None for r in rounds]
              for kind in ("clattn", "torch", "builtin")}
        ratio = [a / b for a, b in zip(gf["clattn"], gf["torch"]) if a and b]
        lines.append("| %s | %s | %s | %s | %s |" % (
            case, median_text(gf["clattn"]), median_text(gf["torch"]),
            median_text(ratio, "%.2f×") if ratio else "–", median_text(gf["builtin"])))
    table = "\n".join(lines) + "\n"
    print(table)
    return write_between(args.write, "flex", table) if args.write else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--torch", action="store_true", help="time torch's flex_attention alone (JSON lines)")
    ap.add_argument("--n", type=int, default=4096, help="queries and keys (a multiple of 8; default 4096)")
    ap.add_argument("--cap", type=float, default=5.0, help="seconds per case (default 5)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--clattn")
    ap.add_argument("--write")
    args = ap.parse_args()
    if args.n % DOCS:
        ap.error("--n must be a multiple of %d" % DOCS)
    if args.torch:
        run_torch(args.n, args.cap)
        return 0
    if not args.rounds or not args.clattn:
        ap.error("give --torch, or --rounds with --clattn")
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
