"""
Benchmark two presets side by side (default: baseline vs bov) and print one readable table.

    python bench.py                               # size "cpu" on a CPU, paper_135m on CUDA (--device): a few minutes
    python bench.py --quick                       # a smoke run: one round, few steps
    python bench.py --variants baseline bov_shared_table --size paper_780m
    python bench.py --json > bench.json           # the same numbers for machines
    python bench.py --plot                        # the benchmark, plus Fig 5a as a PNG in --plot_dir
    python bench.py --plot out/cpu_baseline/metrics.jsonl out/cpu_bov/metrics.jsonl   # plots only: Fig 5a,
                                                  # val bpb vs tokens (Fig 4), coefficients per layer (Fig 2)

What it reports, per preset A and B and as the ratio B/A:
  accounting   dense and table parameters, training FLOPs/token (GPT.estimate_flops), and the tokens that
               the paper's FLOPs budgets buy (1.5e18 at paper_135m, Section 3; 3.91e19 at paper_780m,
               Section 5); analytic, on the meta device, for the two paper sizes and the measured size (with --config)
  FLOPs        measured with FlopCounterMode on one forward+backward of a fresh model of the measured size,
               next to its estimate, both with every window made full ("L": the counter counts masked
               attention as dense), so at or above the accounting's figure (above when a window is
               shorter than the context)
  KV cache     analytic bytes (bfloat16) per sequence and per batch of --serve_batch at 1K..1M tokens, the
               value tables' own bytes and the net saving of B over A: eq. 6, dKV = (L/3) d (T - |V|),
               in bytes, less the int32 token id per token that a BoV cache keeps. Breakeven: the context
               where the net saving is 0 (the paper's T = |V| for one sequence; n T = |V| for the n =
               --serve_batch sequences of a batch that share the tables)
  cache        the bytes the decode cache really allocated (KVCache.nbytes() of the cache preallocated for
               the decode model's block_size, filled by a prefill to the largest context) next to
               GPTConfig.kv_cache_bytes, and B/A bytes per position next to B's
               (2L - n_vfree) d s (+ 4 with tables) over A's: ((2L - n_vfree) d s + 4) / (2L d s) for BoV / baseline
  speed        prefill and decode tokens/s at --contexts (each: prefill --decode_batch sequences of
               random ids to context - steps, then --steps greedy one-token decode steps, A's and B's
               steps taking turns and timed one by one, so both meet the same load), train step
               ms (forward + backward + Muon/AdamW step on --batch sequences of block_size), peak
               memory of a decode at the largest context and of a train step (the preset's own weights,
               cache and optimizer state, plus the most the run allocates on top). A and B run interleaved
               for --rounds rounds after one warm-up, the order alternating (A B, B A, ...) so that
               neither always runs first. The table gives each preset's median and, as B/A, the median
               of the per-round ratios with their quartiles: read the ratio, which pairs A and B run
               side by side; the two medians come from different rounds and may disagree with it. B/A > 1
               is B faster in the tok/s rows, and B slower or larger in the ms and memory rows.
The decode model has block_size = the largest context, or the preset's own if that is larger (the "cpu"
size trains at 256), so its sliding windows are a quarter of that, rounded up to 128; the train step uses the preset's own block_size.
"""

import contextlib
import difflib
import json
import math
import os
import shlex
import signal
import stat
import statistics
import sys
import time
import weakref
from dataclasses import fields, replace

# Ctrl-C while torch loads (a second or more): one line and exit 130, not a traceback (left ignored if it was, `cmd &`)
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    def _stopped_while_loading(*_):
        try:
            os.write(2, b"bench.py: interrupted\n")
        finally:  # exit 130 even with stderr closed (`2>&-`)
            os._exit(130)
    signal.signal(signal.SIGINT, _stopped_while_loading)

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from torch.utils.weak import WeakIdKeyDictionary

from model import GPT, GPTConfig, LIMITS, SIZES, VARIANTS, compile_failed, first_line, out_of_memory
from prepare_data import (ArgumentParser, atomic_write, handle_signals, json_lines, missing_top, out_dir_problem, plural,
                          reconfigure_stdout, remove_unused, silence_stdout, whole_number)
from sample import autocast, check_device, keep_freed_memory, resolve_dtype

PAPER_BUDGETS = {"paper_135m": 1.5e18, "paper_780m": 3.91e19}  # training FLOPs of the paper's runs
KV_CONTEXTS = [2 ** k for k in range(10, 21, 2)]              # 1K, 4K, 16K, 64K, 256K, 1M
KV_DTYPE = torch.bfloat16

# FlopCounterMode knows the CUDA attention kernels but not SDPA's CPU kernel: count it (4 T_q T_k D per head
# forward) with backward = 2 x forward, nanochat's convention and estimate_flops'. torch counts the CUDA backward
# kernels as 5 matmuls (2.5 x forward, torch/utils/flop_counter.py sdpa_backward_flop_count, recomputing the
# scores): they are mapped to 2 x forward too, so that a GPU measures what the CPU does.
_forward = lambda q, k, v, *args, **kwargs: sdpa_flop_count(q, k, v)
_backward = lambda grad, q, k, v, *args, **kwargs: 2 * sdpa_flop_count(q, k, v)
SDPA_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _forward,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _backward,
    torch.ops.aten._scaled_dot_product_efficient_attention_backward: _backward,
    torch.ops.aten._scaled_dot_product_flash_attention_backward: _backward,
    torch.ops.aten._scaled_dot_product_cudnn_attention_backward: _backward,
}


class BenchError(Exception):
    """one-line, user-facing problem with the arguments"""


# -----------------------------------------------------------------------------
# analytic: parameters, FLOPs, KV cache

def accounting(variants, configs):
    """Parameters and FLOPs/token of each variant at each size (meta device: no memory); configs: label -> (size,
    overrides), as run() makes it."""
    rows = []
    for label, (size, overrides) in configs.items():
        for v in variants:
            model = GPT.meta(GPTConfig.preset(size, v, **overrides))
            n, flops = model.num_params(), model.estimate_flops()
            budget = PAPER_BUDGETS.get(size) if not overrides else None
            rows.append(dict(size=label, variant=v, dense_params=n["dense"], table_params=n["tables"],
                             scaling_params=n["scaling"], flops_per_token=flops, budget_flops=budget,
                             budget_tokens=budget / flops if budget else None))
    return rows


def kv_per_token(cfg, dtype):
    """((2L - n_vfree) d s + 4 if it caches ids) bytes: K and V per layer, no V where V-free, an int32 id for tables."""
    return cfg.kv_cache_bytes(1, 1, dtype)


def kv_memory(cfg_a, cfg_b, batch, dtype=KV_DTYPE):
    """Analytic decode memory of A and B at KV_CONTEXTS: rows, and the breakeven contexts."""
    s, d, V = dtype.itemsize, cfg_b.n_embd, cfg_b.vocab_size
    tab_a, tab_b = cfg_a.table_bytes(dtype), cfg_b.table_bytes(dtype)
    # what B has more of than A: V-free layers (no V cached) and value tables (|V| x d each)
    n_vfree = len(cfg_b.v_free_layers()) - len(cfg_a.v_free_layers())
    n_tables = cfg_b.n_tables() - cfg_a.n_tables()
    rows = []
    for T in KV_CONTEXTS:
        seq_a, seq_b = cfg_a.kv_cache_bytes(1, T, dtype), cfg_b.kv_cache_bytes(1, T, dtype)
        rows.append(dict(context=T, seq_bytes_a=seq_a, seq_bytes_b=seq_b, table_bytes_a=tab_a, table_bytes_b=tab_b,
                         net_saving_seq=seq_a + tab_a - seq_b - tab_b,
                         net_saving_batch=batch * (seq_a - seq_b) + tab_a - tab_b,
                         eq6_bytes=(n_vfree * T - n_tables * V) * d * s))  # eq. 6 for any pair, without the ids
    # breakeven: the tokens (T for one sequence, n T for n sequences sharing the tables) where B's saved cache
    # pays for its extra tables, or (B caching more per token, A holding more table bytes) where A's tables
    # stop outweighing B's larger cache: B saves above the breakeven in the first case, below it in the second
    per_token_saving = kv_per_token(cfg_a, dtype) - kv_per_token(cfg_b, dtype)
    extra_tables = tab_b - tab_a
    below = per_token_saving < 0 and extra_tables < 0
    if below:
        breakeven = extra_tables / per_token_saving  # both negative
    elif per_token_saving > 0:
        breakeven = max(extra_tables, 0) / per_token_saving  # 0 when B adds no table bytes
    elif per_token_saving == 0 and extra_tables < 0:
        breakeven = 0  # the same cache, fewer table bytes: B saves from the first token
    else:
        breakeven = None  # B saves no cache per token and no table bytes
    per_seq = breakeven / batch if breakeven is not None else None
    # the whole contexts at which B saves bytes, for one sequence and for each of the batch's: from the first
    # past the root (at the root itself B saves 0) on; or, below, from 1 to the last before the root (none when
    # the root is at 1 token or less)
    first_saving = lambda tokens: (None if tokens is None or (below and tokens <= 1)
                                   else 1 if below else math.floor(tokens) + 1)
    last_saving = lambda tokens: math.ceil(tokens) - 1 if below and tokens > 1 else None
    return dict(dtype=str(dtype).replace("torch.", ""), batch=batch, rows=rows, breakeven_tokens=breakeven,
                # eq. 6's root T = (tables added) |V| / (V-free layers added): |V| for BoV against the baseline
                # (and for the baseline against BoV, both negative)
                breakeven_paper=n_tables * V / n_vfree if n_tables * n_vfree > 0 else None,
                breakeven_context_batch=per_seq,
                saves_from_context=first_saving(breakeven), saves_from_context_batch=first_saving(per_seq),
                saves_until_context=last_saving(breakeven), saves_until_context_batch=last_saving(per_seq))


def measured_flops(cfg, device):
    """{measured: FlopCounterMode FLOPs per token of one forward+backward, estimate: estimate_flops}, every
    window the whole context (window_pattern L): a masked SDPA is counted over all T x T scores, the estimate
    over the window."""
    cfg = replace(cfg, window_pattern="L")
    torch.manual_seed(0)
    model = GPT(cfg, device=device)
    idx = torch.randint(0, cfg.vocab_size, (1, cfg.block_size), device=device)
    with FlopCounterMode(display=False, custom_mapping=SDPA_FLOPS) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    return dict(measured=counter.get_total_flops() / idx.numel(), estimate=model.estimate_flops())


# -----------------------------------------------------------------------------
# measured: speed and memory

def sync(device):
    """Wait for the device's queued work, so that a timing includes it."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)  # the bench's GPU, not the current one (cuda:0 unless set)
    elif kind == "mps":
        torch.mps.synchronize()


class LiveBytes(TorchDispatchMode):
    """Peak bytes of live tensor storage while active, for the CPU, which keeps no allocator statistics:
    the storages of `tensors` (weights, cache, optimizer state...) plus every storage an op creates,
    until its last tensor dies."""

    def __init__(self, tensors):
        super().__init__()
        self.live = self.peak = 0
        self.seen = WeakIdKeyDictionary()
        for t in tensors:
            self.track(t)

    def track(self, t):
        storage = t.untyped_storage()
        if storage in self.seen:
            return
        n = storage.nbytes()
        self.seen[storage] = n
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self.free, n)

    def free(self, n):
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.track(t)
        return out


def peak_bytes(device, fn, existing):
    """Peak memory of fn(): the bytes of the tensors existing() lists (weights, cache, optimizer state) plus
    the most that fn() adds on top of what is allocated before it. On CUDA from the allocator's statistics,
    so that the other preset's model, also on the device, is not counted; LiveBytes elsewhere."""
    if torch.device(device).type == "cuda":
        own = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in existing()}
        sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return sum(own.values()) + torch.cuda.max_memory_allocated(device) - before
    with LiveBytes(existing()) as tracker:
        fn()
    return tracker.peak


class Bench:
    """One preset built twice: `decoder` (block_size = the largest context, at least the preset's; its cache in
    `self.cache`) and `train_model` with its optimizers; plus the fixed random batch (x, y) and prompts they run on."""

    def __init__(self, size, variant, overrides, max_context, batch, device, dtype, decode_batch=1):
        self.device, self.dtype = device, dtype
        torch.manual_seed(0)
        self.train_cfg = GPTConfig.preset(size, variant, **overrides)
        self.decode_cfg = replace(self.train_cfg, block_size=max(max_context, self.train_cfg.block_size))
        self.decoder = GPT(self.decode_cfg, device=device).eval()
        self.train_model = GPT(self.train_cfg, device=device)
        self.opts = self.train_model.configure_optimizers()
        g = torch.Generator().manual_seed(0)
        V, T = self.train_cfg.vocab_size, self.train_cfg.block_size
        self.x = torch.randint(0, V, (batch, T), generator=g).to(device)
        self.y = torch.randint(0, V, (batch, T), generator=g).to(device)
        self.prompt = torch.randint(0, V, (decode_batch, self.decode_cfg.block_size), generator=g).to(device)
        self.cache = None

    @torch.no_grad()
    def prefill(self, n):
        with autocast(self.device, self.dtype):  # the cache takes the autocast dtype
            self.cache = self.decoder.new_cache(self.prompt.size(0), self.decode_cfg.block_size)
            logits, _ = self.decoder(self.prompt[:, :n], cache=self.cache, last_only=True)
        return logits[:, -1].argmax(-1, keepdim=True)

    @torch.no_grad()
    def step(self, tok):
        """One greedy one-token decode step: the next tokens (B, 1), under the caller's autocast (decode and
        time_decode hold one across all the steps, as sample.py does: an autocast entered and left at each
        step would drop autocast's bf16 copies of the weights and cast every weight again)."""
        logits, _ = self.decoder(tok, cache=self.cache)
        return logits[:, -1].argmax(-1, keepdim=True)

    def decode(self, tok, steps):
        with autocast(self.device, self.dtype):
            for _ in range(steps):
                tok = self.step(tok)
        tok.tolist()  # wait for the device

    def timed(self, fn, *args):
        """(result of fn(*args), seconds it took, the device included)."""
        sync(self.device)
        t0 = time.perf_counter()
        out = fn(*args)
        sync(self.device)
        return out, time.perf_counter() - t0

    def train_step(self):
        with autocast(self.device, self.dtype):
            _, loss = self.train_model(self.x, self.y)
        loss.backward()
        for opt in self.opts:
            opt.step()
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        loss.item()

    def time_train_step(self):
        return 1e3 * self.timed(self.train_step)[1]

    def memory(self, context, steps):
        """(peak bytes of `steps` decode steps after a prefill to context - steps, peak bytes of a train step)."""
        tok = self.prefill(context - steps)
        weights_and_cache = list(self.decoder.parameters()) + list(self.decoder.buffers()) + self.cache.tensors()
        decode = peak_bytes(self.device, lambda: self.decode(tok, steps), lambda: weights_and_cache)
        state = lambda: list(self.train_model.parameters()) + list(self.train_model.buffers()) + [
            t for opt in self.opts for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        train = peak_bytes(self.device, self.train_step, state)
        self.cache = None
        return decode, train


def time_decode(benches, context, steps, order):
    """Prefill and decode tok/s of each bench at `context` -> ([prefill tok/s], [decode tok/s]) in bench order.
    Each bench prefills context - steps tokens; then the benches take `steps` one-token decode steps in turn
    (A B, B A, ...), each timed alone, so that both meet the same moments of a busy machine."""
    prefill_s, decode_s, toks = [0.0] * len(benches), [0.0] * len(benches), [None] * len(benches)
    with autocast(benches[0].device, benches[0].dtype):  # one for all the steps (Bench.step says why)
        for k in order:
            toks[k], prefill_s[k] = benches[k].timed(benches[k].prefill, context - steps)
        for s in range(steps):
            for k in (order if s % 2 == 0 else order[::-1]):
                toks[k], t = benches[k].timed(benches[k].step, toks[k])
                decode_s[k] += t
    seqs = [b.prompt.size(0) for b in benches]  # --decode_batch each
    return ([n * (context - steps) / t for n, t in zip(seqs, prefill_s)],
            [n * steps / t for n, t in zip(seqs, decode_s)])


def paired(a, b):
    """medians of A and B, and the median and quartiles of the per-round ratios B/A (their spread
    says how far to trust the ratio on a busy machine)."""
    ratios = sorted(y / x for x, y in zip(a, b))
    if len(ratios) == 1:  # one round: no spread
        q1 = q3 = ratios[0]
    else:
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")  # inclusive: within the data
    return dict(a=statistics.median(a), b=statistics.median(b), ratio=statistics.median(ratios), ratio_q1=q1, ratio_q3=q3)


def compiled_graphs():
    """Graphs torch.compile has made so far in this process (torch._dynamo is imported only under --compile)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def measure(benches, contexts, steps, rounds, log, compiled=False):
    """Interleaved timings: after one warm-up round, `rounds` rounds of A and B for every measurement,
    the order alternating from round to round (A B, B A, ...). Compiled models compile every graph
    the timed rounds use in the warm-up; out["recompiled"] counts any made after it (None: eager)."""
    runs = {("decode", c): ([], []) for c in contexts} | {("prefill", c): ([], []) for c in contexts}
    runs["train_ms"] = ([], [])
    warm = None
    for r in range(rounds + 1):
        if r == 1 and compiled:
            warm = compiled_graphs()
        log(f"round {r}/{rounds}" + (" (warm-up" + (", compiling every graph" if compiled else "") + ")" if r == 0 else ""))
        order = (0, 1) if r % 2 else (1, 0)  # A B, then B A: neither always runs first, on colder caches
        for c in contexts:
            prefill, decode = time_decode(benches, c, steps, order)
            if r:
                for k in (0, 1):
                    runs["prefill", c][k].append(prefill[k])
                    runs["decode", c][k].append(decode[k])
        for k in order:
            ms = benches[k].time_train_step()
            if r:
                runs["train_ms"][k].append(ms)
    out = {"decode_tok_s": {}, "prefill_tok_s": {}}
    for c in contexts:
        out["decode_tok_s"][c] = paired(*runs["decode", c])
        out["prefill_tok_s"][c] = paired(*runs["prefill", c])
    out["train_step_ms"] = paired(*runs["train_ms"])
    out["per_round"] = {"decode": dict(zip(map(str, contexts), (runs["decode", c] for c in contexts))),
                     "train_ms": runs["train_ms"]}
    out["recompiled"] = compiled_graphs() - warm if compiled and warm is not None else None
    if compiled and torch.device(benches[0].device).type != "cuda":
        # LiveBytes is a TorchDispatchMode, under which compiled code does not run: it would measure eager runs
        out["peak_bytes"] = None
        return out
    log("peak memory")
    mem = [bench.memory(max(contexts), steps) for bench in benches]
    out["peak_bytes"] = {"decode": dict(a=mem[0][0], b=mem[1][0], ratio=mem[1][0] / mem[0][0]),
                         "train_step": dict(a=mem[0][1], b=mem[1][1], ratio=mem[1][1] / mem[0][1])}
    return out


def cache_allocated(benches, context):
    """Bytes the decode cache allocated after a real prefill to `context`, against the analytic figure,
    and B/A bytes per position against ((2L - n_vfree) d s + 4 if it caches ids) for each."""
    out = {}
    for name, bench in zip("ab", benches):
        bench.prefill(context)
        cfg, cache = bench.decode_cfg, bench.cache
        s = cache.k[0].element_size()  # the formula written out, not kv_cache_bytes again: an independent check
        expected = (2 * cfg.n_layer - len(cfg.v_free_layers())) * cfg.n_embd * s + (4 if cfg.caches_ids() else 0)
        out[name] = dict(context=context, max_len=cache.max_len, filled=cache.pos, dtype=str(cache.k[0].dtype)[6:],
                         batch=cache.k[0].size(0), allocated=cache.nbytes(),
                         analytic=cfg.kv_cache_bytes(cache.k[0].size(0), cache.max_len, cache.k[0].dtype),
                         per_token=cache.nbytes() / cache.k[0].size(0) / cache.max_len, per_token_expected=expected)
        bench.cache = None
    out["exact"] = all(out[k]["allocated"] == out[k]["analytic"] for k in "ab")
    out["ratio_per_token"] = out["b"]["per_token"] / out["a"]["per_token"]
    out["ratio_expected"] = out["b"]["per_token_expected"] / out["a"]["per_token_expected"]
    return out


# -----------------------------------------------------------------------------
# plots

def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed). A $MPLBACKEND is dropped first: the PNGs
    are Agg's, and a backend matplotlib cannot find (Jupyter's matplotlib_inline, outside the notebook) fails its import."""
    os.environ.pop("MPLBACKEND", None)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def run_names(paths):
    """{metrics path: its run's label in the plots}: the folder of the file (its out_dir), with as many folders above
    it as tell apart runs whose folders have the same name (a/out/cpu_bov and b/out/cpu_bov: a/out/cpu_bov, b/...).
    Shown as written, not read by matplotlib: $ is not maths, a leading _ does not hide the run, bytes that are
    not UTF-8 show as U+FFFD."""
    parts = {p: os.path.dirname(os.path.abspath(p)).strip(os.sep).split(os.sep) for p in paths}
    labels = {}
    for p, folders in parts.items():
        labels[p] = p  # two files in one folder: their own paths
        for k in range(1, len(folders) + 1):
            label = os.sep.join(folders[-k:])
            if label and all(q == p or os.sep.join(f[-k:]) != label for q, f in parts.items()):
                labels[p] = label
                break

    def shown(label):
        label = os.fsencode(label).decode("utf-8", "replace").replace("$", r"\$")
        return "\u200b" + label if label.startswith("_") else label  # a zero-width space: not a hidden label
    return {p: shown(label) for p, label in labels.items()}


def save(fig, ax, path, title, xlabel, ylabel, **legend):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(**legend)
    fig.tight_layout()
    try:  # an interrupted or failed write never leaves half a PNG
        atomic_write(path, lambda f: fig.savefig(f, dpi=120, format="png"), f"{path}.tmp{os.getpid()}")
    finally:
        pyplot().close(fig)


def fig5a(path):
    """The paper's Fig 5a: memory saved by BoV against context length T (16K..1M), for the nanochat (32,768)
    and Qwen3 (151,936) vocabularies, at paper_780m in bfloat16. The saving is eq. 6's Delta KV (the
    baseline's cache, less BoV's cache and tables), computed with kv_cache_bytes/table_bytes, so BoV's
    int32 id per token is in: it crosses 0 just past T = |V| (at 32,773 and 151,961 here, by the ids' 4 bytes a
    token). Solid, as a share of the baseline's K+V cache, the ids aside:

        saved % ~ 100 x n_bov d (T - |V|) / (2 L d T)  =  100 (n_bov / 2L) (1 - |V| / T)

    which saturates at 1/6, the 16.7 % that the paper's plotted curves approach. Dashed, as a share of the
    V cache alone (the caption's words, "fraction of V cache memory saved"): twice that, up to 1/3. Neither
    depends on L or d once BoV takes the last third of the layers, but for the ids' share, 4 / (2 L d s) with s
    bytes a value."""
    plt = pyplot()
    contexts = [int(2 ** (14 + k / 8)) for k in range(6 * 8 + 1)]  # 16K .. 1M
    fig, ax = plt.subplots(figsize=(6, 4))
    for vocab, name, color in ((32768, "nanochat tok. (32,768)", "C0"), (151936, "qwen3 tok. (151,936)", "C1")):
        base, bov = (GPTConfig.preset("paper_780m", v, vocab_size=vocab) for v in ("baseline", "bov"))
        kv, saved = [], []
        for T in contexts:
            net = base.kv_cache_bytes(1, T, KV_DTYPE) - bov.kv_cache_bytes(1, T, KV_DTYPE) - bov.table_bytes(KV_DTYPE)
            v_bytes = base.n_layer * base.n_embd * T * KV_DTYPE.itemsize
            saved.append(100 * net / v_bytes)
            kv.append(100 * net / base.kv_cache_bytes(1, T, KV_DTYPE))
        ax.plot(contexts, kv, color=color, label=f"{name}, % of K+V cache")
        ax.plot(contexts, saved, color=color, linestyle="--", label=f"{name}, % of V cache")
    ax.set_xscale("log", base=2)
    ax.set_xticks([2 ** 14, 2 ** 16, 2 ** 18, 2 ** 20], ["16K", "64K", "256K", "1M"])
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_ylim(-20, 35)  # up to the 1/3 the dashed lines saturate at; below -20 % (the shortest contexts) is cut
    save(fig, ax, path, "Fig 5a: KV cache memory saved by BoV (paper_780m)", "context length", "memory saved (%)", fontsize=7)


def read_records(path):
    """The dict records of a train.py metrics JSONL file."""
    if os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode):  # /dev/zero: read line by line, it never ends
        raise BenchError(f"metrics file {path} is a device (train.py writes metrics.jsonl)")
    try:
        with open(path, encoding="utf-8") as f:
            records = [rec for _, rec in json_lines(f, path, BenchError) if isinstance(rec, dict)]
    except OSError as e:
        raise BenchError(f"cannot read metrics file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise BenchError(f"metrics file {path} is not UTF-8 text (train.py writes metrics.jsonl)") from None
    return records


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_metrics(path):
    """[(tokens, val_bpb)] from a train.py metrics JSONL file (records without val_bpb skipped);
    BenchError for a record whose numbers or coefficients ({layer: {name: value}}) are not finite numbers."""
    points = []
    for r in read_records(path):
        coeffs = r.get("coefficients")
        if coeffs is not None and not (isinstance(coeffs, dict) and all(
                str(l).isdigit() and isinstance(v, dict) and all(number(c) for c in v.values()) for l, v in coeffs.items())):
            raise BenchError(f"{path}: a record's coefficients are not {{layer: {{name: number}}}}: {str(coeffs)[:60]}")
        if r.get("val_bpb") is None:
            continue
        x = r.get("tokens")  # train.py writes it in every record; the curves are drawn against tokens
        if not (number(r["val_bpb"]) and number(x)):
            raise BenchError(f"{path}: a record's val_bpb and tokens are not finite numbers: {r['val_bpb']!r}, {x!r}")
        points.append((x, r["val_bpb"]))
    if not points:
        raise BenchError(f"{path} has no records with val_bpb")
    return points


def coefficient_plot(paths, path):
    """The paper's Fig 2: the learned coefficients (gamma_v; or alpha_v on V and beta_v on V~) of every
    target layer at the last evaluation of each run, against the layer index."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn, names = 0, run_names(paths)
    for p in paths:
        evals = [r for r in read_records(p) if r.get("coefficients")]
        if not evals:
            continue
        last = evals[-1]["coefficients"]
        layers = sorted(last, key=int)
        run = names[p]
        for name in sorted({n for v in last.values() for n in v}):
            have = [l for l in layers if name in last[l]]  # a run may mix, e.g. gamma_v in some layers only
            ax.plot([int(l) for l in have], [last[l][name] for l in have], marker="o", label=f"{run}: {name}")
            drawn += 1
    if not drawn:
        plt.close(fig)
        return False
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.xaxis.get_major_locator().set_params(integer=True)  # layers are whole numbers: no tick at 4.2
    save(fig, ax, path, "Fig 2: learned value coefficients at the end of training", "layer index", "coefficient value", fontsize=7)
    return True


def val_curves(paths, path):
    """Validation bits per byte against training tokens, one line per metrics file (named by its folder)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = run_names(paths)
    for p in paths:
        points = read_metrics(p)
        label = names[p]
        ax.plot([x for x, _ in points], [y for _, y in points], marker=".", label=label)
    save(fig, ax, path, "validation curves (Fig 4)", "training tokens", "validation bits per byte")


# -----------------------------------------------------------------------------
# the report

def human(n):
    """bytes -> '1.5 GiB' (signed)"""
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if round(n, None if unit == "B" else 1) < 1024 or unit == "TiB":  # as printed: 1048575 B is 1.0 MiB
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024


def short(n):
    """1971234567 -> '1.97B'"""
    for unit, k in (("", 1), ("K", 1e3), ("M", 1e6), ("B", 1e9), ("T", 1e12)):
        if round(abs(n) / k, 2 if unit else None) < 1000 or unit == "T":  # as printed: 999,999 is 1.00M
            return f"{n / k:.2f}{unit}" if unit else f"{n:.0f}"


def context_name(T):
    return f"{T // 2 ** 20}M" if T % 2 ** 20 == 0 else f"{T // 1024}K" if T % 1024 == 0 else str(T)


def kv_lines(size, kv):
    """The report's lines for one size's kv_memory(): the breakeven, then bytes per context."""
    lines = [f"KV cache at size {size} ({kv['dtype']}, batch {kv['batch']}); value tables: A {human(kv['rows'][0]['table_bytes_a'])}, "
             f"B {human(kv['rows'][0]['table_bytes_b'])} (one copy, shared by the batch); "
             f"saving = A cache + A tables - B cache - B tables"]
    be, paper = kv["breakeven_tokens"], kv["breakeven_paper"]
    if be is None:
        breakeven = "none (B saves no cache per token and no table bytes)"
    elif be == 0:
        breakeven = "none needed (B adds no table bytes and saves memory at every context)"
    else:
        breakeven = f"T = {be:,.1f} tokens for one sequence"
        if paper is not None:
            breakeven += f" (eq. 6: T = {paper:,.10g})"
        saves = lambda k: (f"up to T = {kv['saves_until_' + k]:,}" if kv.get("saves_until_" + k) is not None
                           else f"from T = {kv['saves_from_' + k]:,}" if kv["saves_from_" + k] is not None
                           else "at no context")
        breakeven += (f", B saves {saves('context')}; {kv['batch']} sequences sharing the tables: "
                      f"T = {kv['breakeven_context_batch']:,.1f} each ({kv['batch']} x T = {be:,.1f}), B saves "
                      f"{saves('context_batch')}")
    lines.append(f"  breakeven: {breakeven}")
    lines.append(f"  {'context':>8} {'A / seq':>11} {'B / seq':>11} {'A / batch':>11} {'B / batch':>11} "
                 f"{'saving / seq':>13} {'saving / batch':>15}")
    for row in kv["rows"]:
        n = kv["batch"]
        lines.append(f"  {context_name(row['context']):>8} {human(row['seq_bytes_a']):>11} {human(row['seq_bytes_b']):>11} "
                     f"{human(n * row['seq_bytes_a']):>11} {human(n * row['seq_bytes_b']):>11} "
                     f"{human(row['net_saving_seq']):>13} {human(row['net_saving_batch']):>15}")
    return lines


def report(r):
    """The text table of run()'s results r, or of the same read back from --json (its context keys strings)."""
    a, b = r["variants"]["a"], r["variants"]["b"]
    lines = [f"bench.py: A = {a}, B = {b}; measured at size {r['size']}"
             + (f" ({', '.join(f'{k}={v}' for k, v in r['overrides'].items())})" if r["overrides"] else "")
             + f" on {r['device']} ({r['threads']} threads, {r['dtype']}), torch {r['torch']}", ""]
    lines.append("Parameters and training FLOPs per token (analytic; tokens = budget / FLOPs per token)")
    w = max(11, *(len(row["size"]) for row in r["accounting"]))
    lines.append(f"  {'size':<{w}} {'variant':<18} {'dense params':>13} {'table params':>13} {'FLOPs/token':>14} {'budget':>8} {'tokens':>7}")
    for row in r["accounting"]:
        budget = f"{row['budget_flops']:.3g}" if row["budget_flops"] else "-"
        tokens = short(row["budget_tokens"]) if row["budget_tokens"] else "-"
        lines.append(f"  {row['size']:<{w}} {row['variant']:<18} {row['dense_params']:>13,} {row['table_params']:>13,} "
                     f"{row['flops_per_token']:>14,} {budget:>8} {tokens:>7}")
    f = r["flops_measured"]
    lines += ["", f"FLOPs per token measured (FlopCounterMode, one forward+backward of {f['tokens']} tokens) against "
              f"estimate_flops, both with window_pattern L (every window the whole context): at or above the "
              f"table's, which counts the sliding windows"]
    for k, name in (("a", a), ("b", b)):
        off = "" if round(f[k]["measured"]) == f[k]["estimate"] else (
            "   != 1: estimate_flops misses a matrix applied twice or counts one never applied (README \"A new mechanism\")")
        lines.append(f"  {name:<18} measured {f[k]['measured']:>14,.0f}   estimate {f[k]['estimate']:>14,}   "
                     f"measured/estimate {f[k]['measured'] / f[k]['estimate']:.4f}{off}")
    lines.append(f"  B/A measured {f['ratio']:.4f}")
    for size, kv in r["kv_cache"].items():
        lines += ["", *kv_lines(size, kv)]
    c = r["cache_allocated"]
    lines += ["", f"Decode cache allocated (KVCache.nbytes() of a cache preallocated for {c['a']['max_len']:,} positions, "
              f"filled by a prefill to {c['a']['context']:,}, {c['a']['dtype']}"
              + (f", {c['a']['batch']} sequences; bytes/position per sequence" if c['a']['batch'] > 1 else "") + ")"]
    for k, name in (("a", a), ("b", b)):
        same = "==" if c[k]["allocated"] == c[k]["analytic"] else "!="
        lines.append(f"  {name:<18} {c[k]['allocated']:>14,} bytes {same} analytic {c[k]['analytic']:>14,}   "
                     f"{c[k]['per_token']:,.0f} bytes/position")
    lines.append(f"  B/A bytes per position {c['ratio_per_token']:.6f}, expected ((2L - n_vfree) d s + ids) of B over A "
                 f"{c['ratio_expected']:.6f}")
    s = r["speed"]
    compiled = "torch.compile'd, " if s["compile"] else ""
    lines += ["", f"Speed and memory ({compiled}{plural(s['rounds_run'], 'round')} after a warm-up, A and B interleaved, "
              f"alternating order; A, B: medians; B/A: median of the per-round ratios, their quartiles beside it;",
              "  B/A > 1 is B faster in the tok/s rows, B slower or larger in the ms and memory rows"
              + ("; peak memory is measured once, after the rounds)" if s["peak_bytes"] is not None else ")")]
    if s["peak_bytes"] is None:
        lines.append("  (peak memory not measured: on the CPU it is counted by a dispatch mode, under which compiled code does not run)")
    if s.get("recompiled"):
        lines.append(f"  WARNING: {s['recompiled']} graphs were compiled after the warm-up: those rounds' timings include compiling")
    rows = []  # (label, A, B, measurement), formatted once every column's width is known

    def add_row(label, m, fmt):
        rows.append((label, fmt(m["a"]), fmt(m["b"]), m))
    nb = f", batch {s['decode_batch']}" if s["decode_batch"] > 1 else ""
    for ctx, m in s["prefill_tok_s"].items():
        add_row(f"prefill tok/s, {int(ctx) - s['steps']} tokens{nb}", m, lambda x: f"{x:,.0f}")
    for ctx, m in s["decode_tok_s"].items():
        add_row(f"decode tok/s at context {ctx}{nb}", m, lambda x: f"{x:,.1f}")
    add_row(f"train step ms ({s['batch']}x{s['train_block_size']})", s["train_step_ms"], lambda x: f"{x:,.1f}")
    if s["peak_bytes"] is not None:  # (None: compiled on the CPU, see measure)
        add_row(f"peak memory, decode at {max(map(int, s['decode_tok_s']))}{nb}", s["peak_bytes"]["decode"], human)
        add_row("peak memory, train step", s["peak_bytes"]["train_step"], human)
    w = max(len(label) for label, *_ in rows)
    wa = max(12, len(a), *(len(x) for _, x, _, _ in rows))
    wb = max(12, len(b), *(len(y) for _, _, y, _ in rows))
    lines.append(f"  {'':<{w}} {a:>{wa}} {b:>{wb}} {'B/A':>7}  {'quartiles':>11}")
    lines += [f"  {label:<{w}} {x:>{wa}} {y:>{wb}} {m['ratio']:>7.3f}"
              + (f"  {m['ratio_q1']:.3f}-{m['ratio_q3']:.3f}" if "ratio_q1" in m else "") for label, x, y, m in rows]
    return "\n".join(lines)


# -----------------------------------------------------------------------------

VARIANT_FIELDS = sorted({k for spec in VARIANTS.values() for k in spec})  # what --variants sets, not --config
FIELD_DEFAULTS = {f.name: f.default for f in fields(GPTConfig)}  # GPTConfig's defaults: their types read --config


def parse_overrides(text):
    """'n_embd=48,n_head=4,vocab_size=97' -> {'n_embd': 48, 'n_head': 4, 'vocab_size': 97} (ints, as train.py reads
    them, 1e3 too, for GPTConfig's int fields; else strings): the size both presets share. A variant's own
    fields would make A and B alike, so they are refused, as are names GPTConfig does not have."""
    out = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise BenchError(f"--config takes key=value pairs separated by commas, got {item!r}")
        if key not in FIELD_DEFAULTS:
            shared = [k for k in FIELD_DEFAULTS if k not in VARIANT_FIELDS]
            near = difflib.get_close_matches(key, list(FIELD_DEFAULTS), n=1, cutoff=0.7)  # bov_layer: bov_layers
            raise BenchError(f"--config: unknown field {key}; " + (f"did you mean {near[0]}? " if near else "")
                             + f"the fields it sets are {', '.join(shared)}")
        if key in VARIANT_FIELDS:
            raise BenchError(f"--config sets the size both presets share; {key} is a variant's (it would apply to A "
                             f"and B alike): add a variant to VARIANTS in model.py and name it in --variants")
        out[key] = value.strip()
        if type(FIELD_DEFAULTS[key]) is int:  # 12, 1e3, 2.0: whole numbers; 2.5 stays text, for GPTConfig to refuse
            with contextlib.suppress(ValueError):
                out[key] = whole_number(value)
    return out


def parse_args(argv=None):
    cuda = torch.cuda.is_available()
    p = ArgumentParser(prog="bench.py", description="Compare two presets: parameters, FLOPs, KV-cache "
                       "memory, decode/prefill speed, train step time, peak memory. Progress goes to stderr.")
    p.add_argument("metrics", nargs="*", help="train.py metrics JSONL files: with --plot, draw only the plots "
                   "(Fig 5a, val curves, Fig 2 coefficients) and skip the benchmark")
    p.add_argument("--variants", nargs=2, default=["baseline", "bov"], metavar=("A", "B"), help="the two presets (default: baseline bov)")
    p.add_argument("--size", choices=list(SIZES),
                   help="size of the measured models (default: paper_135m when --device is cuda or cuda:N, else cpu)")
    p.add_argument("--config", help="GPTConfig overrides of the measured size, for both presets, e.g. n_layer=6,n_embd=48,vocab_size=97")
    p.add_argument("--contexts", default="128,1024,4096", help="decode contexts, comma-separated (default 128,1024,4096)")
    p.add_argument("--steps", type=int, help="decode steps timed at each context (default 32; --quick 4)")
    p.add_argument("--rounds", type=int, help="interleaved A B rounds after the warm-up (default 7; --quick 1)")
    p.add_argument("--batch", type=int, help="sequences per train step, the speed table's train row (default 8; --quick 2)")
    p.add_argument("--decode_batch", type=int, default=1, help="sequences decoded together in the speed runs (default 1)")
    p.add_argument("--serve_batch", type=int, default=32, help="batch of the analytic KV-cache table (default 32)")
    p.add_argument("--quick", action="store_true", help="a smoke run: --rounds 1 --steps 4 --batch 2 unless given")
    p.add_argument("--device", default="cuda" if cuda else "cpu", help="cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="autocast dtype of the measured runs; auto = bfloat16 on CUDA from Ampere (compute capability 8) on, "
                        "float16 before, float32 elsewhere")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                   help="torch CPU threads (default: the cores this process may use)")
    p.add_argument("--compile", action="store_true", help="torch.compile both presets' decoders (dynamic shapes) and "
                   "train models; the warm-up round compiles every graph the timed rounds use (minutes on a CPU)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    p.add_argument("--plot", action="store_true", help="write fig5a.png; given metrics files, also val_curves.png and "
                   "coefficients.png, without running the benchmark")
    p.add_argument("--plot_dir", default="out/plots", help="folder for the PNGs (default out/plots)")
    args = p.parse_args(argv)
    if args.size is None:  # from --device, not from what the machine has: --device cpu on a GPU box measures cpu
        args.size = "paper_135m" if args.device.startswith("cuda") else "cpu"
    defaults = dict(steps=4, rounds=1, batch=2) if args.quick else dict(steps=32, rounds=7, batch=8)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for k in ("steps", "rounds", "batch", "decode_batch", "serve_batch", "threads"):
        if getattr(args, k) < 1:
            p.error(f"--{k} must be at least 1, got {getattr(args, k)}")
    if args.threads > (os.cpu_count() or 1):  # thousands of OpenMP threads crawl, then fail to start, then crash
        p.error(f"--threads must be at most the {os.cpu_count() or 1} CPUs here, got {args.threads}")
    try:
        args.contexts = sorted({int(c) for c in args.contexts.split(",") if c.strip()})
    except ValueError:
        p.error(f"--contexts must be comma-separated integers, got {args.contexts!r}")
    if not args.contexts:
        p.error("--contexts needs at least one decode context, e.g. --contexts 1024")
    if args.contexts[0] <= args.steps:
        p.error(f"every decode context must exceed --steps ({args.steps}): it is prefilled to context - steps first")
    if args.contexts[-1] > LIMITS["block_size"][0]:  # the decode model's block_size
        p.error(f"--contexts: at most {LIMITS['block_size'][0]:,} ({LIMITS['block_size'][1]}), got {args.contexts[-1]:,}")
    if args.metrics and not args.plot:
        p.error("metrics files are read for --plot only")
    if args.plot:  # before the benchmark runs: its results are not lost to an ImportError at the end
        try:
            pyplot()
        except ImportError as e:
            p.error(f"--plot needs matplotlib ({first_line(e)}): pip install -r requirements.txt, or run without --plot")
    args.plot_dir_made = args.plot and missing_top(args.plot_dir)  # the folder that a failed run removes if still empty
    problem = args.plot and out_dir_problem(args.plot_dir)  # before anything runs: no results lost at the end
    if problem:
        p.error(f"--plot_dir {args.plot_dir} {problem}")
    return args


def run(args, log):
    """Everything but printing: the results dict."""
    overrides = parse_overrides(args.config)
    for v in args.variants:
        GPTConfig.preset(args.size, v, **overrides)  # ValueError, in one line, for a bad name or field
    check_device(args.device)
    keep_freed_memory(args.device)
    dtype = resolve_dtype(args.dtype, args.device)
    torch.set_num_threads(args.threads)
    # label -> (size, overrides): both paper sizes as published, and the measured size; a paper size changed by
    # --config is another model, under a label of its own
    measured = f"{args.size}+config" if overrides else args.size
    sizes = {s: (s, {}) for s in PAPER_BUDGETS} | {measured: (args.size, overrides)}
    a, b = args.variants
    r = dict(variants=dict(a=a, b=b), size=args.size, overrides=overrides, device=args.device, dtype=str(dtype)[6:],
             threads=torch.get_num_threads(), torch=torch.__version__, command=shlex.join(["python", "bench.py"] + (args.argv or [])))
    log("accounting")
    r["accounting"] = accounting(args.variants, sizes)
    r["kv_cache"] = {label: kv_memory(GPTConfig.preset(s, a, **o), GPTConfig.preset(s, b, **o), args.serve_batch)
                     for label, (s, o) in sizes.items()}
    log("building the models")
    benches = [Bench(args.size, v, overrides, max(args.contexts), args.batch, args.device, dtype, args.decode_batch)
               for v in args.variants]
    if args.compile:  # in place, as sample.py --compile: dynamic shapes for the growing cache
        import torch._dynamo.config as dynamo_config  # (not imported by eager runs)
        # the four models share GPT.forward, whose graphs count against one limit (8): raise it, and fail in one
        # line rather than fall back to eager without a word if it is still hit
        dynamo_config.recompile_limit = 64
        dynamo_config.fail_on_recompile_limit_hit = True
        for bench in benches:
            bench.decoder.compile(dynamic=True)
            bench.train_model.compile()
    log("counting FLOPs")
    fa, fb = (measured_flops(bench.train_cfg, args.device) for bench in benches)
    r["flops_measured"] = dict(a=fa, b=fb, ratio=fb["measured"] / fa["measured"], tokens=benches[0].train_cfg.block_size)
    r["cache_allocated"] = cache_allocated(benches, max(args.contexts))
    speed = measure(benches, args.contexts, args.steps, args.rounds, log, compiled=args.compile)
    r["speed"] = dict(speed, steps=args.steps, rounds_run=args.rounds, batch=args.batch, decode_batch=args.decode_batch,
                      train_block_size=benches[0].train_cfg.block_size, compile=args.compile)
    return r


def draw_plots(args, log):
    """Fig 5a, and given metrics files the val curves and Fig 2: the paths of the PNGs written."""
    paths = [os.path.join(args.plot_dir, "fig5a.png")]
    fig5a(paths[0])
    if args.metrics:
        paths.append(os.path.join(args.plot_dir, "val_curves.png"))
        val_curves(args.metrics, paths[-1])
        coeffs = os.path.join(args.plot_dir, "coefficients.png")
        if coefficient_plot(args.metrics, coeffs):
            paths.append(coeffs)
        else:
            log("these runs have no learned coefficients: no coefficients.png")
            if os.path.exists(coeffs):  # an earlier --plot's, of other runs: not left beside these
                os.remove(coeffs)
    return paths


def interrupted():
    print("bench.py: interrupted", file=sys.stderr)
    sys.exit(130)  # 128 + SIGINT, as a shell reports Ctrl-C


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)  # with --plot it imports matplotlib (a second or more)
    except KeyboardInterrupt:
        interrupted()
    args.argv = argv
    log = lambda msg: print(f"bench.py: {msg}", file=sys.stderr, flush=True)

    def fail(e):
        """Exit with the one line for e (a bug is raised again)."""
        if isinstance(e, KeyboardInterrupt):
            interrupted()
        if out_of_memory(e):
            sys.exit(f"bench.py: error: out of memory ({first_line(e)}); lower --decode_batch, --batch, the largest of --contexts, or the model (--size, --config)")
        if args.compile and compile_failed(e):
            sys.exit(f"bench.py: error: torch.compile failed ({first_line(e)}); run without --compile")
        if not isinstance(e, (BenchError, ValueError, OSError)):
            raise e
        if isinstance(e, OSError) and e.filename and e.strerror:  # e.g. a full disk under a PNG: "PATH: No space left ..."
            sys.exit(f"bench.py: error: {e.filename}: {e.strerror}")
        sys.exit(f"bench.py: error: {first_line(e, None)}")

    try:
        if args.plot:  # read the metrics first: a bad file fails before anything is drawn or timed
            for path in args.metrics:
                read_metrics(path)
        r = {} if args.metrics else run(args, log)  # metrics files: plots only
    except (KeyboardInterrupt, Exception) as e:
        if args.plot:  # nothing drawn: the plot folder this run made goes, as it came
            remove_unused(args.plot_dir, args.plot_dir_made)
        fail(e)
    plot_failure = None
    if args.plot:
        try:
            r["plots"] = draw_plots(args, log)
        except (KeyboardInterrupt, Exception) as e:  # a PNG that fails (a full disk, Ctrl-C): the results come first
            plot_failure = e
    try:
        if "speed" in r:
            print(json.dumps(r, indent=1) if args.json else report(r), flush=True)
        elif args.json and plot_failure is None:
            print(json.dumps({"plots": r["plots"]}, indent=1), flush=True)
    except OSError as e:  # the reader left (`| head`: stop quietly), or a full disk
        silence_stdout()
        if not isinstance(e, BrokenPipeError):
            sys.exit(f"bench.py: error: cannot write the results: {e.strerror or e}")
    if plot_failure is not None:
        fail(plot_failure)
    for path in r.get("plots", []):
        log(f"wrote {path}")


if __name__ == "__main__":
    handle_signals({signal.SIGINT: signal.default_int_handler,  # loaded: Ctrl-C is a KeyboardInterrupt again
                    signal.SIGTERM: lambda *_: sys.exit(143)})  # SystemExit: a PNG being written is removed
    reconfigure_stdout()
    main()
