"""
Compare two presets side by side (default baseline vs bov), freshly initialised: their cost, not their quality.

    python bench.py                                   # size cpu on a CPU, paper_135m on CUDA
    python bench.py --variants baseline bov_shared_table --size paper_780m --json
    python bench.py --rounds 7 --decode_batch 32 --contexts 1024
    python bench.py --plot out/cpu_baseline/metrics.jsonl out/cpu_bov/metrics.jsonl   # Figs 5a, 4 and 2
    python bench.py --table out/grid/*/metrics.jsonl --plot_dir docs      # trained runs: Table 1 in miniature

The speed rows (a prefill of context - steps tokens, then --steps one-token steps; a train step) run A and B
interleaved for --rounds after a warm-up, the order alternating and decode steps taking turns, so that both meet
the same machine: each side's median, and the median of the per-round ratios B/A with its quartiles.
"""
import argparse
import ast
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from model import GPT, SIZES, VARIANTS, GPTConfig

autocast = lambda device, dtype: torch.autocast(torch.device(device).type, dtype, enabled=dtype != torch.float32)
PAPER_BUDGETS = {"paper_135m": 1.5e18, "paper_780m": 3.91e19}  # the training FLOPs of the paper's runs

# FlopCounterMode does not know SDPA's CPU kernels: 4 T_q T_k D per head forward, backward twice that, as
# estimate_flops and nanochat count it. torch counts its CUDA backward kernels, which recompute the scores, as
# 2.5 x forward: mapped to 2 x too, so that a GPU measures what a CPU does.
fwd = lambda q, k, v, *args, **kwargs: sdpa_flop_count(q, k, v)
bwd = lambda grad, q, k, v, *args, **kwargs: 2 * sdpa_flop_count(q, k, v)
aten = torch.ops.aten
SDPA_FLOPS = {aten._scaled_dot_product_flash_attention_for_cpu: fwd,
              aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd,
              aten._scaled_dot_product_flash_attention_backward: bwd,
              aten._scaled_dot_product_efficient_attention_backward: bwd,
              aten._scaled_dot_product_cudnn_attention_backward: bwd}

# -----------------------------------------------------------------------------
# Accounting


def count_flops(cfg, device="cpu"):
    """(FLOPs per token that FlopCounterMode counts in one forward+backward, estimate_flops), both of cfg with
    every window the whole context."""
    model = GPT(replace(cfg, window_pattern="L"), device)
    idx = torch.randint(0, cfg.vocab_size, (1, cfg.block_size), device=device)
    with FlopCounterMode(display=False, custom_mapping=SDPA_FLOPS) as counter:
        model(idx, idx)[1].backward()
    return counter.get_total_flops() / idx.numel(), model.estimate_flops()


def breakeven(a, b, batch=1):
    """Eq. 6: the context T at which the V cache that B saves over A, (n_vfree_B - n_vfree_A) d T per sequence,
    pays for its extra tables, (n_tables_B - n_tables_A) |V| d shared by the batch: T = |V| / batch for BoV
    against the baseline (None: B saves no V). The int32 id a BoV cache keeps per position is not in eq. 6."""
    vfree = len(b.v_free_layers()) - len(a.v_free_layers())
    return (b.n_tables() - a.n_tables()) * b.vocab_size / (vfree * batch) if vfree else None

# -----------------------------------------------------------------------------
# Speed


class Bench:
    """One preset, built twice from seed 0: a decoder whose block_size covers the longest context, and a train
    model with its optimizers; a fixed random batch and prompt."""

    def __init__(self, cfg, args, dtype):
        torch.manual_seed(0)
        self.device, self.dtype = args.device, dtype
        self.decoder = GPT(replace(cfg, block_size=max(cfg.block_size, *args.contexts)), args.device).eval()
        self.model = GPT(cfg, args.device)
        self.opts = self.model.configure_optimizers()
        self.x, self.y = torch.randint(0, cfg.vocab_size, (2, args.batch, cfg.block_size), device=args.device)
        self.prompt = torch.randint(0, cfg.vocab_size, (args.decode_batch, max(args.contexts)), device=args.device)

    def prefill(self, context, n):
        """A new cache of `context` positions, the first n filled -> the next tokens (B, 1)."""
        self.cache = self.decoder.new_cache(len(self.prompt), context)
        return self.decoder(self.prompt[:, :n], cache=self.cache)[0].argmax(-1)

    def step(self, tok):
        return self.decoder(tok, cache=self.cache)[0].argmax(-1)

    def train_step(self):
        with autocast(self.device, self.dtype):
            loss = self.model(self.x, self.y)[1]
        loss.backward()
        for opt in self.opts:
            opt.step()
            opt.zero_grad(set_to_none=True)


def timed(fn, *args):
    """(fn(*args), its seconds, the device's queued work included)."""
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else lambda: None
    sync()
    t0 = time.perf_counter()
    out = fn(*args)
    sync()
    return out, time.perf_counter() - t0


def run_round(benches, args, dtype, order):
    """One round of every measurement, the benches in `order` -> {metric: {context: [A, B]}}."""
    out = dict(prefill_tok_s={}, decode_tok_s={})
    n, steps = args.decode_batch, args.steps
    with torch.inference_mode(), autocast(args.device, dtype):
        for c in args.contexts:
            prefill, decode, tok = [0.0, 0.0], [0.0, 0.0], [None, None]
            for k in order:
                tok[k], prefill[k] = timed(benches[k].prefill, c, c - steps)
            for s in range(steps):  # the decode steps take turns: A B, then B A
                for k in (order if s % 2 == 0 else order[::-1]):
                    tok[k], t = timed(benches[k].step, tok[k])
                    decode[k] += t
            out["prefill_tok_s"][c] = [n * (c - steps) / t for t in prefill]
            out["decode_tok_s"][c] = [n * steps / t for t in decode]
    ms = [0.0, 0.0]
    for k in order:
        ms[k] = 1e3 * timed(benches[k].train_step)[1]
    out["train_step_ms"] = {args.batch: ms}
    return out


def paired(a, b):
    """Each side's median over rounds, and the median and quartiles of the per-round ratios B/A."""
    ratios = [y / x for x, y in zip(a, b)]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return dict(a=statistics.median(a), b=statistics.median(b), ratio=statistics.median(ratios), q1=q1, q3=q3)


def run(args):
    """Every number of the table -> a dict, as --json prints it."""
    dtype = getattr(torch, args.dtype)
    cfgs = [GPTConfig.preset(args.size, v, **args.config) for v in args.variants]
    metas = [GPT(cfg, device="meta") for cfg in cfgs]
    both = lambda f, **more: dict(a=f(0), b=f(1), **more)
    r = dict(variants=args.variants, size=args.size, config=args.config, device=args.device, dtype=str(dtype)[6:],
             threads=torch.get_num_threads(), rounds=args.rounds, steps=args.steps, decode_batch=args.decode_batch,
             torch=torch.__version__)
    r["dense_params"] = both(lambda i: metas[i].num_params()["dense"])
    r["table_params"] = both(lambda i: metas[i].num_params()["tables"])
    r["flops_per_token"] = both(lambda i: metas[i].estimate_flops())
    counted = [count_flops(cfg, args.device) for cfg in cfgs]
    r["flops_windows_L"] = both(lambda i: counted[i][0], estimate=[e for _, e in counted])
    for size, budget in PAPER_BUDGETS.items():
        flops = [GPT(GPTConfig.preset(size, v), device="meta").estimate_flops() for v in args.variants]
        r[f"tokens_{size}"] = both(lambda i: budget / flops[i], budget=budget)

    benches = [Bench(cfg, args, dtype) for cfg in cfgs]
    B, T = args.decode_batch, max(args.contexts)
    with autocast(args.device, dtype):  # the cache takes autocast's dtype
        caches = [bench.decoder.new_cache(B, T) for bench in benches]
    kv_dtype = caches[0].k[0].dtype
    r["kv_bytes_per_position"] = both(lambda i: caches[i].nbytes() / (B * T),
                                      analytic=[cfg.kv_cache_bytes(B, T, kv_dtype) / (B * T) for cfg in cfgs])
    r["table_bytes"] = both(lambda i: cfgs[i].table_bytes(kv_dtype))
    del caches  # counted: not held through the timed rounds, whose own caches they would double
    r["breakeven_context"] = dict(one=breakeven(*cfgs), batch=breakeven(*cfgs, args.serve_batch),
                                  serve_batch=args.serve_batch)

    runs = {}
    for rnd in range(args.rounds + 1):
        print(f"round {rnd}/{args.rounds}" + " (warm-up)" * (rnd == 0), file=sys.stderr)
        out = run_round(benches, args, dtype, (0, 1) if rnd % 2 else (1, 0))
        if rnd:  # round 0 warms up
            for metric, per in out.items():
                for c, ab in per.items():
                    runs.setdefault((metric, c), []).append(ab)
    for (metric, c), ab in runs.items():
        r.setdefault(metric, {})[c] = paired(*zip(*ab))
    return r

# -----------------------------------------------------------------------------
# The report


def report(r):
    """The markdown table of run()'s dict."""
    A, B = r["variants"]
    lines = [f"{A} (A) vs {B} (B) at size {r['size']}" + "".join(f", {k}={v}" for k, v in r["config"].items())
             + f" on {r['device']} ({r['threads']} threads, {r['dtype']}, torch {r['torch']}); speed: medians "
             f"over {r['rounds']} rounds after a warm-up, B/A the median of the per-round ratios (quartiles)", "",
             f"| | {A} | {B} | B/A |", "|---|---:|---:|---:|"]

    def row(label, m, fmt="{:,.0f}"):
        ratio = (f"{m['ratio']:.3f} ({m['q1']:.3f}-{m['q3']:.3f})" if "q1" in m
                 else f"{m['b'] / m['a']:.4f}" if m["a"] else "")
        lines.append(f"| {label} | {fmt.format(m['a'])} | {fmt.format(m['b'])} | {ratio} |")
    row("dense params", r["dense_params"])
    row("table params", r["table_params"])
    row("training FLOPs/token (estimate_flops)", r["flops_per_token"])
    f = r["flops_windows_L"]
    same = "==" if [f["a"], f["b"]] == f["estimate"] else "!="
    row(f"FLOPs/token, every window L: FlopCounterMode {same} estimate", f)
    for size in PAPER_BUDGETS:
        m = r[f"tokens_{size}"]
        row(f"tokens {m['budget']:.3g} FLOPs buy at {size}, billions", dict(m, a=m["a"] / 1e9, b=m["b"] / 1e9),
            "{:.2f}")
    kv = r["kv_bytes_per_position"]
    same = "==" if [kv["a"], kv["b"]] == kv["analytic"] else "!="
    row(f"KV-cache bytes/position, KVCache.nbytes() {same} kv_cache_bytes", kv, "{:,.1f}")
    row("value table bytes", r["table_bytes"])
    be = r["breakeven_context"]
    for label, T in (("one sequence", be["one"]), (f"each of {be['serve_batch']} sharing tables", be["batch"])):
        lines.append(f"| eq. 6 breakeven context, {label} | | {'-' if T is None else f'{T:,.6g}'} | |")
    seqs = f", {r['decode_batch']} sequences" if r["decode_batch"] > 1 else ""
    for c, m in r["prefill_tok_s"].items():
        row(f"prefill tok/s, {int(c) - r['steps']} tokens{seqs}", m)
    for c, m in r["decode_tok_s"].items():
        row(f"decode tok/s at context {c}{seqs}", m, "{:,.1f}")
    for n, m in r["train_step_ms"].items():
        row(f"train step ms, batch {n}", m, "{:,.1f}")
    return "\n".join(lines)

# -----------------------------------------------------------------------------
# Plots


def read_metrics(path):
    """train.py's metrics.jsonl -> (its settings, its eval records)."""
    with open(path) as f:
        records = [json.loads(line) for line in f]
    return records[0], [r for r in records if r["type"] == "eval"]


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt
    return plt


def savefig(plot_dir, name, fig, ax, title, xlabel, ylabel):
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(plot_dir, exist_ok=True)
    fig.savefig(os.path.join(plot_dir, name), dpi=120)
    pyplot().close(fig)
    print(f"wrote {os.path.join(plot_dir, name)}", file=sys.stderr)


def plot(paths, plot_dir):
    """Fig 5a; and of the runs' metrics.jsonl, the val curves (Fig 4) and the learned coefficients (Fig 2)."""
    plt = pyplot()

    # Fig 5a: memory BoV saves at paper_780m in bf16, eq. 6 with BoV's ids; over the K+V cache it approaches
    # (L/3) / 2L = 1/6 of it, over the V cache alone (the caption's words) 1/3
    fig, ax = plt.subplots(figsize=(6, 4))
    contexts = [int(2 ** (14 + k / 8)) for k in range(6 * 8 + 1)]  # 16K .. 1M
    for vocab, color in ((32768, "C0"), (151936, "C1")):
        base, bov = (GPTConfig.preset("paper_780m", v, vocab_size=vocab) for v in ("baseline", "bov"))
        kv = [base.kv_cache_bytes(1, T) for T in contexts]
        share = [(a - bov.kv_cache_bytes(1, T) - bov.table_bytes()) / a for a, T in zip(kv, contexts)]
        ax.plot(contexts, [100 * s for s in share], color=color, label=f"vocab {vocab:,}, % of the K+V cache")
        ax.plot(contexts, [200 * s for s in share], "--", color=color, label=f"vocab {vocab:,}, % of the V cache")
    ax.set_xscale("log", base=2)
    ax.set_xticks([2 ** 14, 2 ** 16, 2 ** 18, 2 ** 20], ["16K", "64K", "256K", "1M"])
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_ylim(-20, 35)
    savefig(plot_dir, "fig5a.png", fig, ax, "Fig 5a: KV-cache memory saved by BoV (paper_780m)", "context",
            "memory saved (%)")
    if not paths:
        return
    runs = {os.path.basename(os.path.dirname(os.path.abspath(p))): read_metrics(p)[1] for p in paths}  # by out_dir
    fig, ax = plt.subplots(figsize=(6, 4))
    for run, evals in runs.items():
        ax.plot([e["tokens"] for e in evals], [e["val_bpb"] for e in evals], marker=".", label=run)
    savefig(plot_dir, "val_curves.png", fig, ax, "validation curves (Fig 4)", "training tokens",
            "val bits per byte")
    fig, ax = plt.subplots(figsize=(6, 4))
    for run, evals in runs.items():
        last = evals[-1]["coefficients"]  # {layer: {name: value}} at the last evaluation
        for name in sorted({n for c in last.values() for n in c}):
            layers = sorted((int(layer), c[name]) for layer, c in last.items() if name in c)
            ax.plot(*zip(*layers), marker="o", label=f"{run}: {name}")
    ax.axhline(0, color="gray", linewidth=0.8)
    savefig(plot_dir, "coefficients.png", fig, ax, "Fig 2: learned value coefficients", "layer", "coefficient")

# -----------------------------------------------------------------------------
# Table 1 in miniature: trained runs of every variant, several seeds each

# The paper's val bpb at 135M: Table 1, and BoV matching its best row (Section 1); Fig 5b plots the rest unlabelled
PAPER_BPB = dict(t1_r01=.854, t1_r02=.858, t1_r03=.872, t1_r04=.851, t1_r05=.849, t1_r06=.847, t1_r07=.849,
                 t1_r08=.847, t1_r09=.845, t1_r10=.849, t1_r11=.848, t1_r12=.848, t1_r13=.845, baseline=.854,
                 svformer=.872, bov=.845)
PAPER_ROW = dict(baseline="Table 1 row 1", bov="Sections 4-5", bov_shared_table="Fig 5b", bov_fixed_coeff="Fig 5b",
                 bov_every_layer="Fig 5b", bov_keep_v="Fig 5b", value_embed_gated="Tables 3, 5",
                 resformer="Sections 1, 6", svformer="Fig 1b",
                 **{f"t1_r{i:02d}": f"Table 1 row {i}" for i in range(1, 14)})


def formula(cfg):
    """What a variant's target layers compute, in the paper's notation, and where."""
    layers = cfg.target_layers()
    if not layers:
        return "V"
    tilde = dict(table="E[i]" if cfg.shared_table else "E_v[i]", x0="x0 W_V", v1="V1", x="V")[cfg.value_source]
    learned = cfg.value_coeff == "learned"
    add = f"{'a V + b' if learned else '0.5 V + 0.5'} {tilde}"
    value = add if cfg.value_mix == "add" else "γ " * learned + tilde
    value = "V + 3σ(W_g x) E[i]" if cfg.value_coeff == "gated" else value
    return f"{value} in layers {','.join(map(str, layers))}"


def grid(paths, plot_dir):
    """The markdown table of the runs' final val bpb by variant and seed, and their differences from the baseline
    against the paper's, drawn into plot_dir/table1.png."""
    runs, sizes = {}, {}  # variant -> {seed: last eval record}, and its size
    for config, evals in map(read_metrics, paths):
        runs.setdefault(config["variant"], {})[config["seed"]] = evals[-1]
        sizes[config["variant"]] = config["size"]
    base = [r["val_bpb"] for r in runs["baseline"].values()]
    mean0, noise = statistics.mean(base), 2 * (max(base) - min(base))  # a gap under twice its seed spread: noise
    seeds = sorted({seed for per in runs.values() for seed in per})
    lines = [f"| variant | paper | computes | {' | '.join(f'seed {s}' for s in seeds)} | mean | vs baseline "
             f"| paper | last gamma_v (a, b) by layer |", "|---|---|---|" + "---:|" * (len(seeds) + 3) + "---|"]
    rows = []
    for v in [v for v in VARIANTS if v in runs]:
        bpb = {s: r["val_bpb"] for s, r in runs[v].items()}
        diff = statistics.mean(bpb.values()) - mean0
        paper = PAPER_BPB[v] - PAPER_BPB["baseline"] if v in PAPER_BPB else None
        coeffs = "; ".join(f"{k}: " + ", ".join(f"{x:.2f}" for x in c.values())
                           for k, c in runs[v][max(runs[v])]["coefficients"].items())
        verdict = " (noise)" * (v != "baseline" and abs(diff) < noise)
        lines.append(f"| {v} | {PAPER_ROW[v]} | {formula(GPTConfig.preset(sizes[v], v))} | "
                     + " | ".join(f"{bpb[s]:.3f}" if s in bpb else "" for s in seeds)
                     + f" | {statistics.mean(bpb.values()):.3f} | {diff:+.3f}{verdict} | "
                     + ("" if paper is None else f"{paper:+.3f}") + f" | {coeffs} |")
        rows.append((v, [b - mean0 for b in bpb.values()], diff, paper))
    print("\n".join(lines))
    print(f"\nbaseline: mean {mean0:.3f} over seeds {', '.join(map(str, runs['baseline']))}; twice its seed "
          f"spread, {noise:.3f}, marks a difference as noise")

    fig, ax = pyplot().subplots(figsize=(7, 0.28 * len(rows) + 1.2))
    ax.axvspan(-noise, noise, color="0.9", label="within twice the baseline's seed spread")
    for y, (v, points, diff, paper) in enumerate(rows):
        ax.plot(points, [y] * len(points), "o", color="C0", ms=4, label="each seed (cpu, Shakespeare)" * (y == 0))
        ax.plot([diff], [y], "|", color="C0", ms=12, mew=2, label="mean" * (y == 0))
        if paper is not None:
            ax.plot([paper], [y], "x", color="C3", label="the paper, 135M (Table 1)" * (v == "baseline"))
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="gray", linewidth=0.8)
    savefig(plot_dir, "table1.png", fig, ax, "Table 1 and Fig 5b in miniature",
            "val bpb minus the baseline's mean (lower is better)", "")

# -----------------------------------------------------------------------------


def parse_args(argv=None):
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description="Compare two presets side by side; progress goes to stderr.")
    p.add_argument("--variants", nargs=2, default=["baseline", "bov"], choices=VARIANTS, metavar=("A", "B"))
    p.add_argument("--size", choices=SIZES, default="paper_135m" if cuda else "cpu")
    p.add_argument("--config", default="", help="GPTConfig overrides for both, e.g. n_layer=6,n_embd=48")
    p.add_argument("--contexts", default="128,1024", help="decode contexts, comma-separated")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed at each context")
    p.add_argument("--decode_batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--batch", type=int, default=8, help="sequences of a train step")
    p.add_argument("--serve_batch", type=int, default=32, help="sequences sharing the tables, for the breakeven")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds after the warm-up")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--dtype", default="bfloat16" if cuda else "float32", choices=["float32", "bfloat16"])
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--plot", nargs="*", metavar="METRICS", help="only draw the plots: Fig 5a, and the val curves "
                   "and coefficients of train.py's metrics.jsonl files")
    p.add_argument("--table", nargs="+", metavar="METRICS", help="only the table of trained runs by variant and "
                   "seed (train.py's metrics.jsonl files), and its plot, table1.png")
    p.add_argument("--plot_dir", default="out/plots")
    args = p.parse_args(argv)
    pairs = (kv.split("=") for kv in args.config.split(",") if kv)
    args.config = {k: ast.literal_eval(v) if v[:1].isdigit() or v in ("True", "False") else v for k, v in pairs}
    args.contexts = sorted(int(c) for c in args.contexts.split(","))
    assert args.contexts[0] > args.steps, "each context must exceed --steps: it is prefilled to context - steps"
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.plot is not None:
        return plot(args.plot, args.plot_dir)
    if args.table:
        return grid(args.table, args.plot_dir)
    r = run(args)
    print(json.dumps(r, indent=1) if args.json else report(r))


if __name__ == "__main__":
    main()
