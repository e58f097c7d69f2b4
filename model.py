"""
The GPT of the Bank of Values paper, in one file.

He, Liu, Huang, Zhang (2026), "Do Value Vectors in Deep Layers Need Context from the Residual
Stream?", arXiv 2606.02780. The trunk is nanochat's: RMSNorm without weights, RoPE then QK-norm,
relu^2 MLP, untied lm_head, logit soft-cap, sliding-window attention in an "SSSL" pattern.

The paper's one change, Bank of Values (BoV): in each of the last third of layers the value
vectors no longer come from the residual stream, V = x W_V (eq. 1), but from a per-layer table
looked up by token id, v_p = gamma_v * E_v[i_p] (eq. 5). E_v starts as RMSNorm(wte) W_V of that
layer, so the first forward pass equals the "x0 W_V" variant: to the bit when that pass multiplies
the same rows as the table's one |V| x d matmul (the whole vocabulary in one pass), else up to the
matmul's float rounding, which may depend on its shape. See `Attention.value()`.

The paper's whole value-vector grid (Table 1, Fig 5b, Tables 2-3) is one mechanism: in each
*target* layer a context-free V~ (source "x0", "v1" or "table"; "x" is the ordinary V) either
replaces V (v = c V~) or is added to it (v = a V + b V~), with learned, fixed or gated
coefficients. Named presets pick a size and a variant: `GPTConfig.preset("paper_135m", "bov")`.

Run `python model.py` to list the presets with their parameters and FLOPs.
"""

import errno
import lzma
import math
import os
import re
import signal
import struct
import sys
import zipfile
import zlib
from collections import Counter
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields

# Ctrl-C while torch loads (a second or more): one line and exit 130, not a traceback (left ignored if it was, `cmd &`)
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    def _stopped_while_loading(*_):
        try:
            os.write(2, b"model.py: interrupted\n")
        finally:  # exit 130 even with stderr closed (`2>&-`)
            os._exit(130)
    signal.signal(signal.SIGINT, _stopped_while_loading)

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# Configuration and presets

VE_GATE_CHANNELS = 12  # the gated value embedding's gate reads the first 12 channels of the attention's input (nanochat)

@dataclass
class GPTConfig:
    vocab_size: int = 32768      # the paper's BPE vocabulary; train.py takes the prepared data's, or a larger --vocab_size
    n_layer: int = 12
    n_head: int = 6              # head_dim = n_embd / n_head (128 at both paper sizes)
    n_embd: int = 768
    block_size: int = 2048       # training context length T
    window_pattern: str = "SSSL" # tiled over layers; L = full context, S = a quarter, rounded up to 128; last layer always L
    # --- value vectors (Section 3 of the paper). Defaults are standard attention. ---
    bov_layers: str | tuple = "none"  # target layers (of any variant): "last_third" | "every_other" | "all" | "none" | e.g. (8, 9, 10, 11)
    value_source: str = "table"  # V~ in a target layer: "table" (BoV's E_v[i]) | "x0" (x0 W_V) | "v1" (layer 0's V) | "x" (V itself)
    value_mix: str = "replace"   # "replace": v = c V~  |  "add": v = a V + b V~
    value_coeff: str = "learned" # "learned" (free scalars, c=1 / a=1, b=0 at init) | "fixed" (c=1 / a=b=0.5) | "gated" (a=1, b=3 sigmoid(W_g x[:12]) per head)
    shared_table: bool = False   # one E_v for all target layers instead of one per layer (Fig 5b ablation)

    def __post_init__(self):
        self.bov_layers = self.layer_spec(self.bov_layers)
        self.validate()

    @staticmethod
    def layer_spec(spec):
        """bov_layers as given -> as held: "4,5" (from a command line), 4 (one layer) and a list become a tuple; a
        named set ("last_third", ...) stays as it is (validate() checks both)."""
        if isinstance(spec, str) and re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", spec):
            return tuple(int(i) for i in spec.split(","))
        if isinstance(spec, int) and not isinstance(spec, bool):
            return (spec,)
        return tuple(spec) if isinstance(spec, list) else spec

    # -- named presets --------------------------------------------------------

    @classmethod
    def preset(cls, size, variant="baseline", **overrides):
        """The one entry point: a size from SIZES and a variant from VARIANTS, then field overrides."""
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        names = {f.name for f in fields(cls)}
        bad = sorted(set(overrides) - names)
        if bad:
            raise ValueError(f"unknown GPTConfig field(s) {', '.join(bad)}; fields are {', '.join(sorted(names))}")
        try:
            return cls(**{**SIZES[size], **VARIANTS[variant], **overrides})
        except ValueError as e:  # say which preset: a variant's own layer list may not fit every size
            raise ValueError(f"{e} (size {size}, variant {variant})") from e

    # -- derived quantities ---------------------------------------------------

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    # The layer sets below, at 12 layers:      bov     svformer  bov_keep_v  t1_r09 (x0 W_V)
    #   target_layers(): V changed             8-11    1-11      8-11        8-11
    #   table_layers():  reads a value table   8-11    -         8-11        -
    #   v_free_layers(): no W_V, no V cache    8-11    1-11      -           -
    #   caches_ids():    ids in the KV cache   yes     no        no          no

    def target_layers(self):
        """Indices of the layers whose value vectors the variant changes (Table 1's "Target")."""
        L, spec = self.n_layer, self.bov_layers
        if spec == "none":
            return ()
        if spec == "last_third":
            return tuple(range(2 * L // 3, L))
        if spec == "every_other":  # nanochat's value-embedding layers: the last layer and every second one below it
            return tuple(i for i in range(L) if i % 2 == (L - 1) % 2)
        if spec == "all":  # layer 0 produces V1, so it cannot also consume it
            return tuple(range(1 if self.value_source == "v1" else 0, L))
        return tuple(sorted(set(spec)))

    def windows(self):
        """Attention window of every layer, in tokens including the query itself (nanochat's SSSL)."""
        short = math.ceil(self.block_size / 4 / 128) * 128  # a quarter of the context, rounded up to a multiple of 128 (cpu: 128, a half)
        size = {"L": self.block_size, "S": min(short, self.block_size)}
        w = [size[self.window_pattern[i % len(self.window_pattern)]] for i in range(self.n_layer)]
        w[-1] = self.block_size
        return w

    def table_layers(self):
        """Target layers that read a value table (E_v, or nanochat's value embeddings)."""
        return self.target_layers() if self.value_source == "table" else ()

    def n_tables(self):
        """Value tables the model holds: one per table layer, or one shared by all (Fig 5b)."""
        if not self.table_layers():
            return 0
        return 1 if self.shared_table else len(self.table_layers())

    def v_free_layers(self):
        """Layers whose values need no V cache at decode: a replaced V~ that is a table row or V1."""
        if self.value_mix != "replace" or self.value_source not in ("table", "v1"):
            return ()
        return self.target_layers()

    def caches_ids(self):
        """Whether the decode cache keeps the token ids: V-free layers read their window's table rows by id
        (a table that is added to V only needs this pass's ids, its sum is in the V cache)."""
        return bool(self.table_layers() and self.v_free_layers())

    # -- memory accounting (the paper's Section 4, eq. 6) -----------------------

    def kv_cache_bytes(self, batch, context, dtype=torch.bfloat16):
        """Bytes of the decode cache for `batch` sequences of `context` tokens.
        K for every layer, V for every layer that is not V-free, one int32 id per token if caches_ids()."""
        per_token = (2 * self.n_layer - len(self.v_free_layers())) * self.n_embd * dtype.itemsize
        per_token += 4 if self.caches_ids() else 0
        return batch * context * per_token

    def table_bytes(self, dtype=torch.bfloat16):
        """Bytes of the value tables themselves: n_tables x |V| x d, shared by every sequence."""
        return self.n_tables() * self.vocab_size * self.n_embd * dtype.itemsize

    # -- checks -----------------------------------------------------------------

    def validate(self):
        """Raise ValueError, saying what and why, for a configuration that makes no sense."""
        def bad(msg):
            raise ValueError(f"bad GPTConfig: {msg}")
        whole = lambda x: isinstance(x, int) and not isinstance(x, bool)  # True is an int to Python
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "block_size"):
            value = getattr(self, name)
            if not whole(value) or value <= 0:
                bad(f"{name} must be a positive integer, got {value!r}")
            if name in LIMITS and value > LIMITS[name][0]:  # (n_head: at most n_embd / 2, by the checks below)
                bad(f"{name} must be at most {LIMITS[name][0]:,} ({LIMITS[name][1]}), got {value:,}")
        if self.n_embd % self.n_head:
            bad(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.head_dim % 2:
            bad(f"head_dim={self.head_dim} must be even for RoPE")
        if not isinstance(self.window_pattern, str) or not self.window_pattern or set(self.window_pattern) - set("SL"):
            bad(f"window_pattern must be a non-empty string of 'S' and 'L', got {self.window_pattern!r}")
        said = lambda choices: ", ".join(map(repr, choices[:-1])) + f" or {choices[-1]!r}"  # 'a', 'b' or 'c'
        for name, choices in (("value_source", ("table", "x0", "v1", "x")), ("value_mix", ("replace", "add")),
                              ("value_coeff", ("learned", "fixed", "gated"))):  # a new choice needs its code too
            if getattr(self, name) not in choices:
                bad(f"{name} must be {said(choices)}, got {getattr(self, name)!r}")
        spec = self.bov_layers
        if isinstance(spec, str):
            sets = ("last_third", "every_other", "all", "none")  # target_layers() says what each selects
            if spec not in sets:
                bad(f"bov_layers must be {', '.join(map(repr, sets))} or a list of layer indices, got {spec!r}")
        elif not (isinstance(spec, tuple) and spec and all(whole(i) and 0 <= i < self.n_layer for i in spec)
                  and len(set(spec)) == len(spec)):
            bad(f"bov_layers as a list must hold distinct layer indices in [0, {self.n_layer}), got {spec!r}")
        targets = self.target_layers()
        if self.value_source == "v1" and 0 in targets:
            given = f" (bov_layers={spec!r} at n_layer={self.n_layer} gives {list(targets)})" if isinstance(spec, str) else ""
            bad(f"value_source 'v1' with layer 0 as a target{given}: layer 0 produces V1 and cannot also consume it")
        if self.value_source == "x" and self.value_mix == "add":
            bad("value_source 'x' with value_mix 'add' is V + V, a rescaled V; use 'replace' with a learned coefficient")
        if self.value_coeff == "gated" and (self.value_mix != "add" or self.value_source != "table"):
            bad("value_coeff 'gated' is the additive value embedding of nanochat: it needs value_source 'table' and value_mix 'add'")
        if self.value_source == "x" and self.value_coeff != "learned":
            bad("value_source 'x' with a fixed coefficient is standard attention; use bov_layers 'none'")
        if not isinstance(self.shared_table, bool):
            bad(f"shared_table must be True or False, got {self.shared_table!r}")
        if self.shared_table and self.value_source != "table":
            bad("shared_table needs value_source 'table'")
        if self.value_coeff == "gated" and self.n_embd < VE_GATE_CHANNELS:
            bad(f"the gated value embedding reads {VE_GATE_CHANNELS} channels: n_embd must be at least {VE_GATE_CHANNELS}")


# Sizes: the paper's two models (its Table 6) and one that trains in minutes on 2 CPU cores.
SIZES = {
    "paper_135m": dict(n_layer=12, n_embd=768, n_head=6, vocab_size=32768, block_size=2048, window_pattern="SSSL"),
    "paper_780m": dict(n_layer=24, n_embd=1536, n_head=12, vocab_size=32768, block_size=2048, window_pattern="SSSL"),
    # 6 layers so that "last third" is 2 layers (train.py takes every size's vocab from the prepared data).
    "cpu": dict(n_layer=6, n_embd=192, n_head=6, vocab_size=4096, block_size=256, window_pattern="SSSL"),
}

_LAST, _EVERY, _ALL = "last_third", "every_other", "all"
# Upper bounds of the shape fields, each with its reason (GPTConfig.validate)
LIMITS = dict(vocab_size=(2**31 - 1, "token ids are int32 in the decode cache"),
              n_layer=(1024, "a module per layer; deeper than any GPT"),
              n_embd=(2**20, "its square must stay countable: a matrix of n_embd^2 weights"),
              block_size=(2**24, "positions are float32 in the rotary tables, exact up to 2^24"))


def _v(layers, source, mix="replace", coeff="learned", **kw):
    return dict(bov_layers=layers, value_source=source, value_mix=mix, value_coeff=coeff, **kw)

# Variants. "Last 4" of the paper's 12-layer model is its last third; "Every 2" is every_other.
VARIANTS = {
    "baseline": {},
    "bov": _v(_LAST, "table"),                                  # BoV: v = gamma_v E_v[i] in the last third
    # Table 1 of the paper, rows 1-13 (12-layer model, 1.5e18 FLOPs)
    "t1_r01": {},                                               # V (standard attention)
    "t1_r02": _v(_LAST, "x"),                                   # gamma_v V, last 4
    "t1_r03": _v(_ALL, "v1", coeff="fixed"),                    # V1, all layers but 0 (it makes V1), coefficient 1
    "t1_r04": _v(_EVERY, "v1"),                                 # gamma_v V1, every 2
    "t1_r05": _v(_LAST, "v1", coeff="fixed"),                   # V1, last 4, coefficient 1
    "t1_r06": _v(_LAST, "v1"),                                  # gamma_v V1, last 4
    "t1_r07": _v(_EVERY, "x0"),                                 # gamma_v x0 W_V, every 2
    "t1_r08": _v(_LAST, "x0", coeff="fixed"),                   # x0 W_V, last 4, coefficient 1
    "t1_r09": _v(_LAST, "x0"),                                  # gamma_v x0 W_V, last 4
    "t1_r10": _v(_LAST, "v1", "add", "fixed"),                  # 0.5 V + 0.5 V1, last 4
    "t1_r11": _v(_LAST, "v1", "add"),                           # a V + b V1, last 4
    "t1_r12": _v(_LAST, "x0", "add", "fixed"),                  # 0.5 V + 0.5 x0 W_V, last 4
    "t1_r13": _v(_LAST, "x0", "add"),                           # a V + b x0 W_V, last 4
    # Fig 5b: ablations of BoV's components (12-layer model)
    "bov_shared_table": _v(_LAST, "table", shared_table=True),  # one E_v for all target layers
    "bov_fixed_coeff": _v(_LAST, "table", coeff="fixed"),       # v = E_v[i], no gamma_v
    "bov_every_layer": _v(_ALL, "table"),                       # a table in every layer
    "bov_keep_v": _v(_LAST, "table", "add"),                    # v = a V + b E_v[i]
    # Prior methods: gated value embeddings (Tables 3, 5; cited to modded-nanogpt and snimu, the gate's
    # formula is nanochat's), SVFormer (Fig 1b), and ResFormer's value residual ("Value Residual
    # Learning", Sections 1 and 6; not one of the paper's runs, its nearest is t1_r10)
    "value_embed_gated": _v(_EVERY, "table", "add", "gated"),   # nanochat / modded-nanogpt value embeddings
    "resformer": _v(_ALL, "v1", "add", "fixed"),                # value residual: 0.5 V + 0.5 V1 after layer 0
    "svformer": _v(_ALL, "v1", coeff="fixed"),                  # V1 replaces V after layer 0: t1_r03's model, by its name
}

# -----------------------------------------------------------------------------
# Building blocks

def widest_float(device):
    """float64 for sums and sampling weights; float32 on MPS, which has no float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def norm(x):
    """RMSNorm without learnable weights."""
    return F.rms_norm(x, (x.size(-1),))


def rope_tables(seq_len, head_dim, base=100_000, device=None):
    """cos, sin of shape (seq_len, head_dim/2) for rotary position embeddings. On the meta device their shapes
    alone: torch.arange there imports torch._dynamo (a second or more, for every plan of train.py)."""
    if torch.device(device or "cpu").type == "meta":
        return (torch.empty(seq_len, head_dim // 2, device="meta") for _ in "cs")
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate the two halves of every head of x (B, T, H, D) by position; cos, sin are (T, D/2)."""
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


def window_mask(q_pos, k_pos, window):
    """Boolean (Tq, Tk) mask: query at absolute position p sees keys in (p - window, p]."""
    diff = q_pos[:, None] - k_pos[None, :]
    return (diff >= 0) & (diff < window)


class KVCache:
    """Preallocated decode cache for `batch` sequences of up to `max_len` tokens.

    K for every layer; V for all but the V-free layers (v_free_layers(): V replaced by a table row or V1;
    an x0 W_V value is context-free but is computed from x0, so it is cached). A BoV table layer keeps
    no V: at each step it reads E_v[ids] for the ids in its window again (Attention.table_decode_step)
    and keeps nothing, so the cache holds the token ids once for the whole model (int32). A layer that
    replaces V by V1 reads layer 0's V cache. k[i] and v[i] are (B, H, max_len, D); ids is (B, max_len).
    """

    def __init__(self, config, batch, max_len, dtype, device):
        if not 0 < max_len <= config.block_size:  # past block_size there are no rotary tables (GPT.cos, GPT.sin)
            raise ValueError(f"a KV cache holds 1 to block_size = {config.block_size} positions, not {max_len}")
        B, H, D = batch, config.n_head, config.head_dim
        v_free = set(config.v_free_layers())
        empty = lambda: torch.empty(B, H, max_len, D, dtype=dtype, device=device)
        self.k = [empty() for _ in range(config.n_layer)]
        self.v = [None if i in v_free else empty() for i in range(config.n_layer)]
        self.ids = torch.empty(B, max_len, dtype=torch.int32, device=device) if config.caches_ids() else None
        self.pos = 0  # number of positions already written
        self.rows_epoch = None  # with offloaded tables: the TableOffload.epoch in which the rows of ids were fetched
        self.max_len = max_len

    def tensors(self):
        """Every tensor the cache allocated: K, the V that are kept, the ids."""
        return self.k + [v for v in self.v if v is not None] + ([self.ids] if self.ids is not None else [])

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.tensors())


@dataclass
class PassContext:
    """What every block of one forward pass may read, besides its input x (`ctx` in the blocks)."""
    ids: torch.Tensor            # (B, T) token ids of this pass
    x0: torch.Tensor             # (B, T, C) RMSNorm(wte[ids]), the context-free initial embedding
    cos: torch.Tensor            # (T, D/2) rotary tables at this pass's positions
    sin: torch.Tensor
    pos: int                     # absolute position of ids[:, 0]
    table_rows: object           # table_rows(t, ids) -> ids.shape + (C,): rows of value table t
    table_weight: object = None  # table_weight(t) -> (N, C): the rows that bag_index points into
    cache: KVCache | None = None
    bag_index: torch.Tensor | None = None  # (B, H, pos + 1): H * row(id j) + h; one-token decode
    bags: dict = field(default_factory=dict)  # window -> (rows, offsets) for embedding_bag
    v1: torch.Tensor | None = None  # (B, T, H, D) layer 0's values for the V1 variants: written by its value()

    def bag(self, window):
        """The flat rows (B H W,) of the (N H, D) table view for the last `window` positions up to pos,
        and the offset where each of the B H bags starts; made once per pass for all table layers with
        this window. Keyed by the window, a constant, not by its start: under torch.compile the start
        is symbolic, and a dict lookup on it would recompile at every step."""
        if window not in self.bags:
            B, H, end = self.bag_index.shape
            start = max(0, end - window)
            W = end - start
            self.bags[window] = (self.bag_index[:, :, start:].reshape(-1),
                                 torch.arange(0, B * H * W, W, device=self.bag_index.device))
        return self.bags[window]


class Attention(nn.Module):
    """Causal self-attention with RoPE, QK-norm and an optional sliding window.
    In a target layer the values come from `value()` (the paper's grid); elsewhere V = x W_V."""

    def __init__(self, config, layer, window):
        super().__init__()
        C = config.n_embd
        self.layer, self.window = layer, window
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.target = layer in config.target_layers()
        # the value grid (source, mix, coeff) of a target layer; None elsewhere
        self.source, self.mix, self.coeff = ((config.value_source, config.value_mix, config.value_coeff)
                                             if self.target else (None, None, None))
        self.v_free = layer in config.v_free_layers()
        self.table_idx = None  # which of GPT.tables this layer reads; None: it reads none
        if self.source == "table":
            self.table_idx = 0 if config.shared_table else config.table_layers().index(layer)
        self.c_q = nn.Linear(C, C, bias=False)
        self.c_k = nn.Linear(C, C, bias=False)
        # A layer whose V is replaced by a table row or by V1 never computes x W_V: no W_V parameter.
        self.c_v = None if self.v_free else nn.Linear(C, C, bias=False)
        self.c_proj = nn.Linear(C, C, bias=False)
        if self.coeff == "learned":
            # one scalar each; built on the meta device like every parameter: GPT.init_weights sets them
            if self.mix == "replace":
                self.gamma_v = nn.Parameter(torch.empty(1))  # the paper's gamma_v, unbounded
            else:
                self.alpha_v = nn.Parameter(torch.empty(1))  # on V
                self.beta_v = nn.Parameter(torch.empty(1))   # on V~
        if self.coeff == "gated":
            self.ve_gate = nn.Linear(VE_GATE_CHANNELS, self.n_head, bias=False)  # one gate per head

    def coefficients(self):
        """(c,) of a replace target layer or (a, b) of an add one, learned or fixed: parameters if learned, else the
        fixed 1 / 0.5. Not for a gated layer (its V has coefficient 1 and its b is the gate, both in value(), which
        never calls this) nor for a layer that is no target. Each is one scalar per layer (shape (1,)), as the paper's
        gamma_v; value(), forward()'s cached path, table_decode_step and coefficient_values() (whose floats train.py
        logs) all assume that shape."""
        if self.mix == "replace":
            return (self.gamma_v,) if self.coeff == "learned" else (1.0,)
        return (self.alpha_v, self.beta_v) if self.coeff == "learned" else (0.5, 0.5)

    def value(self, x, ctx):
        """Value vectors (B, T, H, D) of this pass's tokens: eq. 1, or the paper's Section 3 grid.
        Layer 0 also leaves its V in ctx.v1, for the target layers of the V1 variants."""
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, self.n_head, self.head_dim)  # (B, T, C) -> (B, T, H, D)
        if not self.target:
            v = heads(self.c_v(x))                            # V = x W_V
            if self.layer == 0:
                ctx.v1 = v                                    # V1, for the target layers of the "v1" variants
            return v
        if self.source == "table":
            tilde = heads(ctx.table_rows(self.table_idx, ctx.ids))  # E_v[i_p]: a lookup, no matmul
        elif self.source == "x0":
            tilde = heads(self.c_v(ctx.x0))                   # x0 W_V
        elif self.source == "v1":
            tilde = ctx.v1                                    # V of layer 0
        else:
            tilde = heads(self.c_v(x))                        # V itself (Table 1 row 2)
        if self.coeff == "gated":                             # V + g(x) E[i], g in (0, 3) per head
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :VE_GATE_CHANNELS]))  # (B, T, H)
            return heads(self.c_v(x)) + gate.unsqueeze(-1) * tilde
        if self.mix == "replace":
            (c,) = self.coefficients()
            return c * tilde                                  # BoV: v_p = gamma_v E_v[i_p] (eq. 5)
        a, b = self.coefficients()
        return a * heads(self.c_v(x)) + b * tilde

    def forward(self, x, ctx):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)  # (B, T, H, D)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        q = norm(apply_rope(q, ctx.cos, ctx.sin)).transpose(1, 2)  # (B, H, T, D)
        k = norm(apply_rope(k, ctx.cos, ctx.sin)).transpose(1, 2)
        if ctx.cache is None:  # training and evaluation: the whole sequence at once
            v = self.value(x, ctx).transpose(1, 2)  # (B, H, T, D)
            if self.window >= T:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                pos = torch.arange(T, device=x.device)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(pos, pos, self.window))
        elif ctx.bag_index is not None and self.source == "table" and self.v_free:
            # a one-token decode step of a BoV layer (GPT.forward sets bag_index): (B, 1, C), c applied
            return self.c_proj(self.table_decode_step(q, k, ctx))
        else:  # a prefill, or a decode step that reads a V cache: this layer's, or layer 0's (V1)
            # a V-free layer's values are read over the whole window in cached_keys_values: table rows or V1
            v = None if self.v_free else self.value(x, ctx).transpose(1, 2)  # (B, H, T, D)
            k, v, mask = self.cached_keys_values(k, v, ctx)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            if self.v_free:  # attention is linear in V: scale the output, not the window's values
                (c,) = self.coefficients()
                y = c * y
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)

    def table_decode_step(self, q, k, ctx):
        """One decode step of a BoV layer, y_h = gamma_v sum_j p_hj E_v[i_j] over the window (eq. 5 inside
        attention): the softmax weights p are the per-sample weights of one embedding_bag, which reads
        each window row of E_v once and never materialises the window's values. Equal to gathering
        the rows and calling SDPA (cached_keys_values), in fewer passes over memory:
            v = E_v[ids of the window].view(B, W, H, D).transpose(1, 2)    # (B, H, W, D)
            y = gamma_v * softmax(q k^T / sqrt(D)) @ v                    # (B, H, 1, D)"""
        B, H, D = q.size(0), self.n_head, self.head_dim
        _, keys = self.cached_keys(k, ctx)                                             # (B, H, W, D)
        # scores and p in float32 (float64 for a float64 model), as SDPA keeps them inside its kernel: a bf16
        # matmul would round the scores (by up to 0.03 at |score| ~ 8, about 3% of p)
        wide = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False) if torch.is_autocast_enabled(q.device.type) else nullcontext():
            scores = (q.to(wide) * D ** -0.5) @ keys.to(wide).transpose(-1, -2)        # (B, H, 1, W)
        p = torch.softmax(scores, dim=-1, dtype=wide)
        table = ctx.table_weight(self.table_idx)                                       # (N, C)
        if not torch.is_grad_enabled():  # a table that requires grad sends embedding_bag to its backward-ready kernel
            table = table.detach()
        rows, offsets = ctx.bag(self.window)                                           # bag (b, h) = window of head h
        weights = p.reshape(-1).to(table.dtype)                                        # (B H W,), aligned with rows
        y = F.embedding_bag(rows, table.view(-1, D), offsets, per_sample_weights=weights, mode="sum")  # (B H, D)
        (c,) = self.coefficients()
        return (c * y).view(B, 1, H * D).to(q.dtype)                                   # (B H, D) -> (B, 1, C)

    def cached_keys(self, k, ctx):
        """Write this pass's K into the cache; return the window's first position and its keys, from
        the oldest key the first query can see to this pass's last."""
        p0, end = ctx.pos, ctx.pos + k.size(2)
        start = max(0, p0 + 1 - self.window)
        ctx.cache.k[self.layer][:, :, p0:end] = k
        return start, ctx.cache.k[self.layer][:, :, start:end]

    def cached_keys_values(self, k, v, ctx):
        """Write this pass's K (and V, unless V-free) into the cache; return the keys and values in
        the window of this pass's queries, and the mask (None for a one-token step)."""
        cache, p0, T = ctx.cache, ctx.pos, k.size(2)
        end = p0 + T
        start, keys = self.cached_keys(k, ctx)
        if not self.v_free:
            cache.v[self.layer][:, :, p0:end] = v
            values = cache.v[self.layer][:, :, start:end]
        elif self.source == "table":  # gather the window's rows again; they are dropped after the layer
            ids = cache.ids[:, start:end]
            rows = ctx.table_rows(self.table_idx, ids).view(ids.size(0), end - start, self.n_head, self.head_dim)
            values = rows.transpose(1, 2).to(keys.dtype)  # c is applied to the output, in forward
        elif self.source == "v1":
            values = cache.v[0][:, :, start:end]
        else:  # a source added to v_free_layers() needs its branch here: its values over the window, from what the cache keeps
            raise NotImplementedError(f"no decode branch in Attention.cached_keys_values for value_source {self.source!r}")
        mask = None  # one query sees all the keys returned: the window starts at its oldest visible key
        if T > 1:
            mask = window_mask(torch.arange(p0, end, device=k.device), torch.arange(start, end, device=k.device), self.window)
        return keys, values, mask


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config, layer, window):
        super().__init__()
        self.attn = Attention(config, layer, window)
        self.mlp = MLP(config)

    def forward(self, x, ctx):
        x = x + self.attn(norm(x), ctx)
        return x + self.mlp(norm(x))



class TableOffload:
    """Value tables kept in host memory (pinned on CUDA) while the rest of the model runs on `device`.

    BoV's lookup needs only token ids, which are known before the forward pass reaches a table
    layer (Section 4). So `prefetch(ids)` copies the rows of the ids not yet on the device, for all
    tables at once, into a device-side row cache (`device_rows`) keyed by token id, and
    `rows(t, ids)` gathers from it. Each distinct token's rows cross once per `reset()` (once per
    `GPT.stream()` call, for all its sequences); the row cache grows with the number of distinct ids
    seen (powers of two from 64 rows), never to the whole vocabulary up front. A KV cache filled before
    the last reset (a stream paused while another started) has its ids' rows fetched again at its next
    pass. For inference only: the lookups read a copy, so no gradient would reach the tables.
    """

    def __init__(self, tables, device):
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self.host = torch.stack([t.detach().cpu() for t in tables])   # (n_tables, |V|, C) in host memory, wherever they were
        if self.pinned:
            self.host = self.host.pin_memory()
        n, V, C = self.host.shape
        self.device_rows = torch.empty(n, 0, C, dtype=self.host.dtype, device=self.device)  # (n_tables, rows, C)
        self.slot = torch.full((V,), -1, dtype=torch.long, device=self.device)  # token id -> row of device_rows
        self.on_device = torch.zeros(V, dtype=torch.bool)  # slot >= 0, mirrored on the host: fetch reads no device memory
        self.rows_fetched = 0   # (token, table) rows copied host -> device
        self.bytes_moved = 0
        self.epoch = 0          # reset() calls so far
        self.reset()

    def reset(self):
        """Forget the device rows: only at the start of a sequence, since the rows of every id in a KV
        cache must stay on the device (rows are never evicted in between)."""
        self.slot.fill_(-1)
        self.on_device.zero_()
        self.used = 0
        self.epoch += 1

    def prefetch(self, ids, cache=None):
        """Make sure every id in `ids`, and every id already in `cache` (a KVCache that keeps ids), has its rows
        on the device. Data-dependent (unique ids, a growing cache): under torch.compile it runs eagerly, one graph
        break, and torch._dynamo is imported only then (as a decorator it would add a second to every `import model`)."""
        if torch.compiler.is_compiling():
            return torch.compiler.disable(self.fetch)(ids, cache)
        return self.fetch(ids, cache)

    def fetch(self, ids, cache=None):
        """prefetch, always eager."""
        ids = ids.reshape(-1)
        stale = cache is not None and cache.rows_epoch != self.epoch  # a new cache, or one filled before the last reset
        if stale and cache.ids is not None:  # its earlier positions read their rows again (V-free layers, at every step)
            ids = torch.cat([cache.ids[:, :cache.pos].reshape(-1).to(ids.dtype), ids])
        self._fetch(ids)
        if stale:  # only once its rows are there: a fetch that failed (out of memory, Ctrl-C) is made again next time
            cache.rows_epoch = self.epoch

    def _fetch(self, ids):
        """Copy the rows of the ids (1-D) that are not on the device yet into the row cache."""
        # one device -> host copy of the ids (on CUDA it waits for them); the rest is decided on the host, and what
        # goes to the device goes non_blocking from pinned memory, so the host goes on queueing the layers (a unique
        # or a mask on the device, or a copy from pageable memory, would wait for the GPU)
        wanted = ids.cpu().long().unique()
        missing = wanted[~self.on_device[wanted]]
        k = missing.numel()
        if k == 0:
            return
        if self.used + k > self.device_rows.size(1):  # grow the row cache to a power of two from 64 rows, at most |V|
            # (never 1 row, nor one row per distinct prompt token: torch.compile would specialise on such sizes)
            rows = min(max(64, 1 << (self.used + k - 1).bit_length()), self.host.size(1))
            grown = torch.empty(self.host.size(0), rows, self.host.size(2), dtype=self.host.dtype, device=self.device)
            grown[:, :self.used] = self.device_rows[:, :self.used]
            self.device_rows = grown
        # (n_tables, k, C) gathered on the host straight into pinned memory; the caching host allocator keeps each
        # pinned block until the copy that reads it has run (the copy records an event on it), so none is reused early
        staged = torch.empty(self.host.size(0), k, self.host.size(2), dtype=self.host.dtype, pin_memory=self.pinned)
        torch.index_select(self.host, 1, missing, out=staged)
        where = torch.stack([missing, torch.arange(self.used, self.used + k)])  # (2, k): token ids, their rows
        if self.pinned:
            where = where.pin_memory()
        where = where.to(self.device, non_blocking=True)
        self.device_rows[:, self.used:self.used + k].copy_(staged, non_blocking=True)
        self.slot[where[0]] = where[1]
        self.on_device[missing] = True
        self.used += k
        self.rows_fetched += k * self.host.size(0)
        self.bytes_moved += staged.numel() * staged.element_size()

    def rows(self, t, ids):
        """Rows of table t for ids (any shape, every id prefetched) -> ids.shape + (C,)."""
        return self.device_rows[t][self.slot[ids.long()]]


# -----------------------------------------------------------------------------
# The model

class GPT(nn.Module):

    def __init__(self, config, device=None):
        """Build the model and initialise it (see `init_weights`) on `device` (default CPU).
        device="meta" builds the shapes only: parameter counts and FLOPs without any memory."""
        super().__init__()
        config.validate()
        self.config = config
        with torch.device("meta"):
            # an Embedding's own init (normal_) on the meta device imports torch._dynamo (a second or more): it is
            # given an empty weight instead, as every value is set by init_weights
            embedding = lambda: nn.Embedding(config.vocab_size, config.n_embd,
                                             _weight=torch.empty(config.vocab_size, config.n_embd))
            self.wte = embedding()
            self.blocks = nn.ModuleList(Block(config, i, w) for i, w in enumerate(config.windows()))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            # Value tables (|V| x d), one per table layer (table_layers(): BoV's E_v, bov_keep_v's, the gated
            # value embeddings) or one shared: sparse lookups, no matmul.
            self.tables = nn.ModuleList(embedding() for _ in range(config.n_tables()))
        self.offload = None  # set by `offload_tables()`: the tables stay in host memory
        if str(device) != "meta":
            self.to_empty(device=device or "cpu")
            self.init_weights()
        # RoPE tables (block_size, head_dim/2): derived, so not saved in checkpoints.
        cos, sin = rope_tables(config.block_size, config.head_dim, device=self.wte.weight.device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self):
        """nanochat's initialisation as it stood before March 2026 (karpathy/nanochat before 6ed7d1d and a825e63,
        which set wte's std to 0.8 and c_fc's bound to 0.4 s, as the paper's fork has them: README "Differences";
        the gate's 12 channels, 3 sigmoid and small positive init are from 6ed7d1d), drawn from torch's global RNG
        in a fixed order:
            wte                      normal, std 1
            lm_head                  normal, std 0.001
            c_q, c_k, c_v, c_fc      uniform(-s, s), s = sqrt(3 / n_embd)  (std 1/sqrt(n_embd))
            attn.c_proj, mlp.c_proj  zeros, so every block starts as the identity
            gamma_v, alpha_v = 1, beta_v = 0
            ve_gate (gated)          uniform(0, 0.02), gate ~ 1.5
            E_v (BoV)                RMSNorm(wte) W_V of its layer (the paper's Section 5), so the first
                                     pass equals the x0 W_V variant. A shared table takes the first
                                     target layer's W_V.
            E (gated)                uniform(-s, s), as nanochat's value embeddings
        Every layer draws a W_V, used or not, so that the variants consume the same random stream and start
        from the baseline's weights (all but value_embed_gated, whose gates are drawn inside the loop): a BoV
        layer uses its W_V for E_v, then drops it; a layer whose V is replaced by V1 drops it. The initial
        values set in the modules' __init__ are never used: the model is built on the meta device and every
        value is set here.
        """
        cfg = self.config
        s = math.sqrt(3 / cfg.n_embd)
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        w_v = {}  # layer -> the W_V drawn for it
        for i, block in enumerate(self.blocks):
            a = block.attn
            nn.init.uniform_(a.c_q.weight, -s, s)
            nn.init.uniform_(a.c_k.weight, -s, s)
            w_v[i] = nn.init.uniform_(torch.empty_like(a.c_q.weight), -s, s)  # (c_q's shape: c_v may not exist)
            if a.c_v is not None:
                a.c_v.weight.copy_(w_v[i])
            nn.init.zeros_(a.c_proj.weight)
            nn.init.uniform_(block.mlp.c_fc.weight, -s, s)
            nn.init.zeros_(block.mlp.c_proj.weight)
            for name, value in (("gamma_v", 1.0), ("alpha_v", 1.0), ("beta_v", 0.0)):
                if hasattr(a, name):
                    getattr(a, name).fill_(value)
            if hasattr(a, "ve_gate"):
                nn.init.uniform_(a.ve_gate.weight, 0.0, 0.02)
        if cfg.value_coeff == "gated":
            for table in self.tables:
                nn.init.uniform_(table.weight, -s, s)
        else:
            x0_all = norm(self.wte.weight)  # (|V|, C): x0 of every token id
            for t, table in enumerate(self.tables):
                table.weight.copy_(x0_all @ w_v[cfg.table_layers()[t]].T)

    # -- forward --------------------------------------------------------------

    def check_ids(self, idx, cache=None):
        """ValueError, before any kernel runs, for ids outside the vocabulary, a too-long or empty sequence, an empty
        batch, or a batch that is not the cache's."""
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be a (batch, time) tensor of int64 or int32 token ids, got shape {tuple(idx.shape)} dtype {idx.dtype}")
        lo, hi = torch.stack(torch.aminmax(idx)).tolist() if idx.numel() else (0, 0)  # one read from the device, not two
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size}), got min {lo} max {hi}")
        limit = self.config.block_size if cache is None else cache.max_len - cache.pos
        if idx.size(1) > limit:
            what = f"block_size {self.config.block_size}" if cache is None else f"the {cache.max_len - cache.pos} positions left in the KV cache"
            raise ValueError(f"sequence of {idx.size(1)} tokens is longer than {what}")
        if idx.size(1) == 0:
            raise ValueError("empty sequence: idx needs at least one token")
        if idx.size(0) == 0:
            raise ValueError("empty batch: idx needs at least one sequence")
        if cache is not None and cache.k[0].size(0) != idx.size(0):
            raise ValueError(f"a batch of {idx.size(0)} sequences, but the KV cache holds {cache.k[0].size(0)}")

    def forward(self, idx, targets=None, *, reduction="mean", cache=None, last_only=False):
        """logits (B, T, |V|) and, given targets (-1 = ignore), the loss: a scalar mean (or sum, reduction="sum")
        over the targets, or the per-token losses (B, T) with reduction="none" (ignored positions give 0). last_only: the
        logits (B, 1, |V|) of the last position and no loss, all that generation needs from a prefill.
        cache: a KVCache (new_cache); idx is written at cache.pos, which then advances by T."""
        if last_only and targets is not None:
            raise ValueError("last_only=True gives no loss: pass targets=None")
        if not torch.compiler.is_compiling():  # data-dependent checks stay out of compiled graphs
            self.check_ids(idx, cache)
        B, T = idx.shape
        pos = 0 if cache is None else cache.pos
        if cache is not None and cache.ids is not None:
            cache.ids[:, pos:pos + T] = idx
        if self.offload is not None:  # bring the rows of new ids over before the trunk needs them
            self.offload.prefetch(idx, cache)
        bag_index = None
        if cache is not None and cache.ids is not None and T == 1 and self.config.v_free_layers():
            bag_index = self.decode_bag_index(cache, pos)
        x0 = norm(self.wte(idx))
        ctx = PassContext(ids=idx, x0=x0, cos=self.cos[pos:pos + T], sin=self.sin[pos:pos + T], pos=pos,
                          table_rows=self.table_rows, table_weight=self.table_weight, cache=cache, bag_index=bag_index)
        x = x0
        for block in self.blocks:
            x = block(x, ctx)
        if cache is not None:
            cache.pos += T
        if last_only:
            x = x[:, -1:]  # (B, 1, C): skip the head's |V| columns for every earlier prompt position
        logits = self.lm_head(norm(x)).float()
        logits = 15 * torch.tanh(logits / 15)  # soft-cap the logits to (-15, 15)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1, reduction=reduction)
        return logits, (loss.view(B, T) if reduction == "none" else loss)

    def decode_bag_index(self, cache, pos):
        """(B, H, pos + 1) int64, bag_index[b, h, j] = H r + h with r = ids[b, j]: a (N, C) table viewed as
        (N H, D) has one row per (token, head), and its row H r + h is head h of table row r. With offloaded
        tables r is the id's row in the device row cache. Built once per decode step over every cached
        position; each BoV layer bags the last `window` columns (PassContext.bag, Attention.table_decode_step)."""
        r = cache.ids[:, None, :pos + 1]  # (B, 1, pos + 1) token ids: rows of a table
        if self.offload is not None:
            r = self.offload.slot[r.long()]  # their rows in the device row cache instead
        H = self.config.n_head
        return torch.add(torch.arange(H, device=r.device)[:, None], r, alpha=H)  # H r + h in one op: (B, H, pos + 1)

    def offload_tables(self, device):
        """Run on `device` with the value tables left in host memory (see TableOffload)."""
        for name, child in self.named_children():
            if name != "tables":
                child.to(device)
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        if len(self.tables):
            self.offload = TableOffload([t.weight for t in self.tables], device)
            for t, table in enumerate(self.tables):  # one host copy: the parameters become views of it
                table.weight.data = self.offload.host[t]
        return self

    def _apply(self, fn, *args, **kwargs):
        """nn.Module's .to() / .half() / .cuda() ...: refused once the tables are offloaded. Each would copy the table
        parameters apart from the host copy that decoding reads (TableOffload.host), or move the tables to the device
        after all: convert the model first, then call offload_tables()."""
        if self.offload is not None:
            raise RuntimeError("the value tables are offloaded: convert or move the model before offload_tables(), not after")
        return super()._apply(fn, *args, **kwargs)

    def table_weight(self, t):
        """Value table t as (rows, C): the parameter, or the device row cache of offloaded tables."""
        return self.offload.device_rows[t] if self.offload is not None else self.tables[t].weight

    def table_rows(self, t, ids):
        """Rows of value table t for token ids (any shape) -> ids.shape + (C,)."""
        if self.offload is not None:
            return self.offload.rows(t, ids)
        return F.embedding(ids, self.tables[t].weight)

    # -- optimisation -----------------------------------------------------------

    def configure_optimizers(self, matrix_lr=0.02, embedding_lr=0.30, unembedding_lr=0.008, scalar_lr=0.50,
                             table_lr=0.15, weight_decay=0.28):
        """Table 6's split and rates (defaults: its 135M column; table_lr 0.15 is Section 5's): Muon on
        every 2-D block matrix, with decoupled weight decay; AdamW (no weight decay) on the token
        embedding, the lm_head, the value tables and the scalar coefficients. Muon's momentum 0.95
        (Nesterov) and AdamW's betas 0.8/0.95 and eps 1e-10 are not in the paper (README, "Differences").
        As in nanochat, the AdamW rates of the embedding, lm_head and tables are scaled by
        (n_embd/768)^-0.5. Returns [muon, adamw]; every group has an "initial_lr" for the schedule."""
        scale = (self.config.n_embd / 768) ** -0.5
        matrices = [p for p in self.blocks.parameters() if p.dim() == 2]
        scalars = [p for p in self.blocks.parameters() if p.dim() < 2]
        adamw_groups = [
            dict(name="embedding", params=[self.wte.weight], lr=embedding_lr * scale),
            dict(name="lm_head", params=[self.lm_head.weight], lr=unembedding_lr * scale),
            dict(name="tables", params=list(self.tables.parameters()), lr=table_lr * scale),
            dict(name="scalars", params=scalars, lr=scalar_lr),
        ]
        adamw_groups = [g for g in adamw_groups if g["params"]]
        grouped = [id(p) for p in matrices] + [id(p) for g in adamw_groups for p in g["params"]]
        if sorted(grouped) != sorted(id(p) for p in self.parameters()):  # a new parameter outside blocks needs its group
            n = Counter(grouped)
            odd = [name for name, p in self.named_parameters() if n[id(p)] != 1]
            raise AssertionError(f"every parameter must be in exactly one optimizer group; not so: {', '.join(odd)} "
                                 "(add a new parameter's group in GPT.configure_optimizers)")
        muon = torch.optim.Muon([dict(name="matrices", params=matrices)], lr=matrix_lr, momentum=0.95,
                                nesterov=True, weight_decay=weight_decay)
        fused = self.wte.weight.device.type in ("cpu", "cuda")  # one kernel for all AdamW tensors
        adamw = torch.optim.AdamW(adamw_groups, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0, fused=fused)
        for opt in (muon, adamw):
            for g in opt.param_groups:
                g["initial_lr"] = g["lr"]
        return [muon, adamw]

    # -- checkpoints ------------------------------------------------------------

    def save_checkpoint(self, path, **extra):
        """Write {"model": state_dict, "model_config": config, **extra} to `path` atomically
        (a temporary file in the same folder, then os.replace): a crash never leaves half a file."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                torch.save({"model": self.state_dict(), "model_config": asdict(self.config), **extra}, f)
                f.flush()
                os.fsync(f.fileno())  # on disk before the rename, so a crash cannot leave an empty checkpoint
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    @classmethod
    def from_checkpoint(cls, path, device="cpu"):
        """Load a train.py checkpoint -> (model in eval mode on `device`, checkpoint dict).
        path may be the run's folder (its ckpt.pt), as nanoGPT's --out_dir. Raises FileNotFoundError /
        ValueError with a one-line message for a missing or unreadable file."""
        path = checkpoint_file(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(no_checkpoint(path))
        problem = unreadable_checkpoint(path)
        if problem:
            raise ValueError(problem)
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # damaged inside, or not train.py's; never retried without weights_only
            why = "a weights-only load refused its contents" if "weights_only" in str(e) else first_line(e, None)
            raise ValueError(damaged_checkpoint(path, why)) from None
        try:
            config = GPTConfig(**ckpt["model_config"])
            model = cls(config, device="meta")
            model.load_state_dict(ckpt["model"], assign=True)
        except Exception as e:  # from another version, or edited: say which entry does not fit
            lines = [l.strip() for l in str(e).splitlines() if l.strip()] or [type(e).__name__]
            raise ValueError(f"cannot read checkpoint {path}: {type(e).__name__}: {' '.join(lines[:2])[:300]}") from None
        model.cos, model.sin = rope_tables(config.block_size, config.head_dim)  # not saved: the meta-built model needs real ones
        return model.to(device).eval(), ckpt

    # -- generation -----------------------------------------------------------

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
        """Append max_new_tokens sampled tokens to idx (B, T) and return the result (B, T + n).
        temperature 0 is greedy. See `stream()` for tokens one step at a time."""
        out = [idx] + list(self.stream(idx, max_new_tokens, temperature, top_k, use_cache, generator))
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
        """Yield the new tokens (B, 1) one by one. With use_cache the prompt is prefilled once and
        each step feeds one token; when the context is full, the cache restarts from the last half
        block (without the cache, the context is simply cropped to the last block_size tokens)."""
        cfg = self.config
        self.check_ids(idx)
        check_temperature(temperature)  # before the prefill, not at the first sample after it
        if self.offload is not None:
            self.offload.reset()
        cache, seq, nxt = None, idx, None
        for step in range(max_new_tokens):
            if not use_cache:
                logits, _ = self(seq[:, -cfg.block_size:], last_only=True)
            elif cache is None or cache.pos == cache.max_len:  # prefill; when full, restart from the last half block
                cache = self.new_cache(idx.size(0), cfg.block_size)
                prompt = seq if step == 0 else seq[:, -max(1, cfg.block_size // 2):].clone()  # clone: no view offset to compile
                logits, _ = self(prompt, cache=cache, last_only=True)
            else:  # the last token itself, not a view into seq: under torch.compile a view's offset is one more symbol
                logits, _ = self(nxt, cache=cache)
            if not torch.isfinite(logits[:, -1]).all():  # NaN would sample nothing, or argmax token 0, silently
                raise FloatingPointError(f"the model's logits are not finite (NaN or inf) at new token {step + 1}, "
                                         f"computed in {logits.dtype}")
            nxt = self.sample_next(logits[:, -1, :], temperature, top_k, generator)
            seq = torch.cat([seq, nxt], dim=1)
            yield nxt

    @staticmethod
    def sample_next(logits, temperature=1.0, top_k=None, generator=None):
        """(B, |V|) logits -> (B, 1) next tokens: greedy at temperature 0, else top-k sampling."""
        check_temperature(temperature)
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        # float64 (float32 on MPS), the maximum subtracted first and the temperature at least the dtype's smallest
        # normal number: a tiny temperature gives 0 and -inf (greedy), never NaN
        wide = widest_float(logits.device)
        logits = (logits.to(wide) - logits.amax(dim=-1, keepdim=True)) / max(temperature, torch.finfo(wide).tiny)
        if top_k:  # None or 0: the whole vocabulary
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)

    def new_cache(self, batch, max_len=None):
        """A KVCache for `batch` sequences of up to max_len (default and at most block_size) tokens, in the dtype of
        the keys and values it will hold: autocast's, which casts every float but float64, or the weights'."""
        p = self.wte.weight
        cast = torch.is_autocast_enabled(p.device.type) and p.dtype != torch.float64
        dtype = torch.get_autocast_dtype(p.device.type) if cast else p.dtype
        return KVCache(self.config, batch, self.config.block_size if max_len is None else max_len, dtype, p.device)

    # -- accounting -----------------------------------------------------------

    @classmethod
    def meta(cls, config):
        """The model's shapes without memory: for FLOPs and parameter counts of the paper sizes."""
        return cls(config, device="meta")

    def num_params(self):
        """{"dense": all parameters but the value tables, "tables": the value tables' entries,
        "scaling": the matmul weights (block matrices + lm_head), Table 6's tokens-to-parameters base}."""
        tables = sum(p.numel() for p in self.tables.parameters())
        scaling = self.lm_head.weight.numel() + sum(p.numel() for p in self.blocks.parameters() if p.dim() == 2)
        return {"dense": sum(p.numel() for p in self.parameters()) - tables, "tables": tables, "scaling": scaling}

    def estimate_flops(self):
        """Training FLOPs per token (forward + backward), nanochat's convention:
        6 x (weights of the matmuls that run: block matrices and lm_head, a W_V used twice counted twice;
        not wte, the value tables, the coefficients) + 12 n_head head_dim min(window, T) per layer."""
        cfg = self.config
        matmul = self.lm_head.weight.numel()
        for block in self.blocks:
            a = block.attn
            matmul += sum(p.numel() for p in block.parameters() if p.dim() == 2)
            if a.source == "x0" and a.mix == "add":
                matmul += a.c_v.weight.numel()  # W_V applied to both x and x0
        attn = sum(12 * cfg.n_head * cfg.head_dim * min(w, cfg.block_size) for w in cfg.windows())
        return 6 * matmul + attn

    def coefficient_values(self):
        """{layer: {"gamma_v": ..} or {"alpha_v": .., "beta_v": ..}} for the learned coefficients (Fig 2)."""
        out = {}
        for i, block in enumerate(self.blocks):
            vals = {n: getattr(block.attn, n).item() for n in ("gamma_v", "alpha_v", "beta_v") if hasattr(block.attn, n)}
            if vals:
                out[i] = vals
        return out


# -----------------------------------------------------------------------------
# Helpers for the scripts' one-line errors and for `python model.py` (not part of the model)

def check_temperature(t):
    """ValueError unless 0 <= t < inf: below 0 the clamp in sample_next would make it greedy, at inf top_k would keep
    every token, and NaN samples nothing."""
    if not 0 <= t < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), not {t}")


def first_line(e, limit=200):
    """An exception's first non-empty line (or its type's name), cut to `limit` characters (None: whole):
    for one-line errors."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)[:limit]


# what a checkpoint in torch.save's legacy (non-zip) format starts with: pickle's PROTO opcode (here protocol 2, its
# default), then torch's magic number
TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\n" + 0x1950A86A20F9469CFC6C.to_bytes(10, "little")


def checkpoint_file(path):
    """path, or path/ckpt.pt when path is a run's folder holding one (as nanoGPT's --out_dir names a run)."""
    inside = os.path.join(path, "ckpt.pt")
    return inside if os.path.isdir(path) and os.path.isfile(inside) else path


def unreadable_checkpoint(path, crc=True):
    """Why the file at path cannot be a checkpoint, in one line, or None when it looks like torch.save's: a whole
    zip archive holding a data.pkl (a truncated copy has lost the directory at the zip's end), or the legacy
    format, a pickle that starts with torch's magic number. With crc, the zip's records must also match their
    CRC-32s: torch.load checks none, so a flipped bit inside a tensor would load. That reads the whole file (a few
    GB/s); without crc only the zip's directory is read. Legacy files, and zips saved with CRCs off, have none."""
    try:
        f = open(path, "rb")
    except OSError as e:
        return f"cannot read checkpoint {path}: {e.strerror or e}"
    with f:
        try:
            head = f.read(14)
            if head[:1] == TORCH_LEGACY_MAGIC[:1] and head[2:] == TORCH_LEGACY_MAGIC[2:]:  # any pickle protocol
                return None
            f.seek(max(0, f.seek(0, os.SEEK_END) - 22 - 65535))  # the end record is in the last 22 + 65535 bytes:
            f.read()  # read them here, as zipfile would take a disk's read error there for "not a zip file"
            f.seek(0)
            if not zipfile.is_zipfile(f):
                return damaged_checkpoint(path, "not a complete zip archive")  # cut short: the end record is gone
            archive = zipfile.ZipFile(f)
            if not any(name.endswith("data.pkl") for name in archive.namelist()):
                return damaged_checkpoint(path, "a zip archive, but not torch.save's: no data.pkl")
            if crc and any(r.CRC for r in archive.infolist()):  # all 0: saved with torch's compute_crc32 off
                bad = archive.testzip()  # the first record whose CRC-32 or local header does not match
                if bad:
                    return damaged_checkpoint(path, f"its record {bad} fails the zip's CRC-32 or header check")
        except OSError as e:
            if e.errno in (None, errno.EINVAL):  # a seek before the start (a damaged offset), bz2's stream
                return damaged_checkpoint(path, f"{type(e).__name__}: {first_line(e)}")
            return f"cannot read checkpoint {path}: {e.strerror or e}"  # the disk or the file system
        except (zipfile.BadZipFile, zlib.error, lzma.LZMAError, struct.error, EOFError, NotImplementedError,
                RuntimeError, ValueError, OverflowError) as e:  # a damaged directory or header: a method, an offset,
            # a name not UTF-8 (UnicodeDecodeError is a ValueError)
            return damaged_checkpoint(path, f"{type(e).__name__}: {first_line(e)}")
    return None


def damaged_checkpoint(path, why):
    """The one line for a file that is there and readable but is no checkpoint of train.py's, or no longer one."""
    return f"cannot read checkpoint {path}: not a checkpoint train.py wrote, or damaged ({why})"


def checkpoints_below(folder, depth=3, most=5, folders=1000):
    """Up to `most` ckpt.pt files in folder or at most `depth` folders below it, sorted, and whether the search saw
    every such folder: bounded (an error message must not walk a whole disk), and never through a symlinked folder
    (no loops). At most `folders` folders are opened, hidden ones skipped, breadth first."""
    found, level, opened = [], [folder], 0
    for _ in range(depth + 1):
        below = []
        for d in level:
            if opened == folders:
                return sorted(found), False
            opened += 1
            try:
                with os.scandir(d) as entries:
                    for e in entries:
                        if e.name == "ckpt.pt" and e.is_file():
                            found.append(e.path)
                        elif e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
                            below.append(e.path)
            except OSError:  # unreadable: not searched
                continue
            if len(found) >= most:
                return sorted(found), False
        level = sorted(below)
    return sorted(found), not level


def no_checkpoint(path):
    """Why there is no checkpoint file at path, in one line: a folder (naming the checkpoints below it),
    or nothing there (naming the train.py command that writes it, for train.py's out/SIZE_VARIANT or its ckpt.pt)."""
    parts = os.path.normpath(path).split(os.sep)
    if parts[-1] == "ckpt.pt":
        parts = parts[:-1]  # its run's folder, which may be given instead (--ckpt out/cpu_baseline)
    command = "`python train.py`"
    if len(parts) >= 2 and parts[-2] == "out":  # train.py's default --out_dir
        size = next((s for s in SIZES if parts[-1].startswith(s + "_") and parts[-1][len(s) + 1:] in VARIANTS), None)
        if size:  # a size with a preset file (the paper's) trains from it: --size alone keeps the cpu run's data and budget
            preset = f"config/{size}.py"
            how = preset if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), preset)) else f"--size={size}"
            command = f"`python train.py {how} --variant={parts[-1][len(size) + 1:]}`"
    if os.path.isdir(path) and not os.access(path, os.R_OK | os.X_OK):  # its files cannot be seen, nor searched
        return f"cannot read the folder {path}: permission denied"
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(path) and os.path.isdir(folder) and not os.access(folder, os.X_OK):  # out/cpu_bov/ckpt.pt
        return f"cannot read the folder {folder}: permission denied"
    if os.path.isdir(os.path.join(path, "ckpt.pt")):
        return f"{os.path.join(path, 'ckpt.pt')} is a folder, not a checkpoint file"
    if os.path.isdir(path):
        found, whole = checkpoints_below(path)
        if found:
            return f"{path} is a folder without ckpt.pt; checkpoints below it: {', '.join(found[:4])}{', ...' * (len(found) > 4)}"
        where = "in or below it" if whole else "in it or in the first folders below it (a bounded search)"
        return f"{path} is a folder with no checkpoint (ckpt.pt) {where}; {command} writes one"
    return f"no checkpoint at {path}; {command} writes one"


def compile_failed(e):
    """Whether e comes from torch.compile (e.g. inductor finding no working C++ compiler). torch._dynamo is
    looked up only if something already loaded it: otherwise e cannot be one of its errors."""
    dynamo = sys.modules.get("torch._dynamo.exc")
    return dynamo is not None and isinstance(e, dynamo.TorchDynamoException)


def out_of_memory(e):
    """Whether e is an allocation that failed: numpy's or torch's, on the host or the GPU (scripts say so in one line)."""
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e)) or (
        isinstance(e, ValueError) and "Maximum allowed dimension exceeded" in str(e))  # numpy: a size past 2^63 bytes


def layer_list(layers):
    """(16, 17, ..., 23) -> '16-23'; (1, 3, ..., 23) -> '1,3,...,23'; () -> '-'; else comma-separated."""
    steps = {b - a for a, b in zip(layers, layers[1:])}
    if len(layers) < 3 or len(steps) != 1 or (len(layers) == 3 and steps != {1}):  # (1, 3, 5) says it all
        return ",".join(map(str, layers)) or "-"
    return f"{layers[0]}-{layers[-1]}" if steps == {1} else f"{layers[0]},{layers[1]},...,{layers[-1]}"


def describe_presets(size):
    """One line per variant: target layers, parameters and FLOPs per token at this size."""
    rows, missing = [], []
    for name in VARIANTS:
        try:
            cfg = GPTConfig.preset(size, name)
        except ValueError as e:  # e.g. a variant's own layer list that this size does not have, or a bad setting
            missing.append(f"{name}: not built ({str(e.__cause__ or e).removeprefix('bad GPTConfig: ')})")
            continue
        m = GPT.meta(cfg)
        n = m.num_params()
        rows.append((name, layer_list(cfg.target_layers()), n["dense"], n["tables"], m.estimate_flops()))
    w = max(len("targets"), *(len(r[1]) for r in rows))
    v = max(len("variant"), *(len(r[0]) for r in rows))
    lines = [f"{'variant':<{v}} {'targets':<{w}} {'dense params':>13} {'table params':>13} {'FLOPs/token':>15}"]
    lines += [f"{name:<{v}} {t:<{w}} {d:>13,} {tb:>13,} {f:>15,}" for name, t, d, tb, f in rows]
    return "\n".join(lines + missing)


if __name__ == "__main__":
    import argparse
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # started ignored (`python model.py &`): stays so
        signal.signal(signal.SIGINT, signal.default_int_handler)  # loaded: Ctrl-C is a KeyboardInterrupt again
    ap = argparse.ArgumentParser(prog="model.py", allow_abbrev=False,
                                 description="List the model presets (sizes x variants) with parameters and FLOPs/token.")
    ap.add_argument("--size", default="paper_135m", choices=list(SIZES))
    # --help is written below, as the listing is: argparse's own write drops an error (a full disk) unseen
    wants_help = bool({"-h", "--help"} & set(sys.argv[1:]))
    args = None if wants_help else ap.parse_args()
    try:
        text = ap.format_help().rstrip("\n") if wants_help else (
            f"sizes: {', '.join(SIZES)}\nvariants: {', '.join(VARIANTS)}\n\n"
            f"at size {args.size} ({', '.join(f'{k}={v}' for k, v in SIZES[args.size].items())}):\n"
            f"{describe_presets(args.size)}")
    except KeyboardInterrupt:
        print("model.py: interrupted", file=sys.stderr)
        sys.exit(130)
    try:
        print(text, flush=True)
    except OSError as e:  # the reader left (`python model.py | head`: stop quietly), or a full disk; not again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        if not isinstance(e, BrokenPipeError):
            sys.exit(f"model.py: error: cannot write the {'help' if wants_help else 'listing'} to stdout: {e.strerror or e}")
