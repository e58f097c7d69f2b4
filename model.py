"""
The GPT of He, Liu, Huang, Zhang (2026), "Do Value Vectors in Deep Layers Need Context from the Residual
Stream?", arXiv 2606.02780, in one file. The trunk is nanochat's: RMSNorm without weights, RoPE then QK-norm,
relu^2 MLP, untied lm_head, logits soft-capped at 15, sliding-window attention in an "SSSL" pattern.

Standard attention computes its values from the residual stream, V = x W_V (eq. 1). Bank of Values (BoV)
looks them up by token id in each of the last third of layers instead: v_p = gamma_v E_v[i_p] (eq. 5), with
E_v a learned |V| x d table per layer that starts as RMSNorm(wte) W_V, so that the first forward pass equals
the "x0 W_V" variant. Such a layer has no W_V, keeps no V cache at decode (only the token ids), and its table
can stay in host memory with only the needed rows fetched (Section 4).

The paper's whole grid of value vectors (Table 1, Fig 5b and the prior methods) is one mechanism,
`Attention.value()`: in each target layer a context-free V~ (a table row, x0 W_V or layer 0's V1) replaces V
(v = c V~) or is added to it (v = a V + b V~), with learned, fixed or gated coefficients. Each cell is a named
preset: `GPTConfig.preset("paper_135m", "bov")`. `python model.py` lists them.
"""

import base64
import math
import os
from dataclasses import dataclass, fields

import tiktoken
import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# Configuration and presets

CHOICES = dict(bov_layers=("last_third", "every_other", "all", "none"),
               value_source=("table", "x0", "v1", "x"),
               value_mix=("replace", "add"),
               value_coeff=("learned", "fixed", "gated"))


@dataclass
class GPTConfig:
    vocab_size: int = 32768       # the paper's BPE; train.py takes the prepared data's
    n_layer: int = 12
    n_head: int = 6               # head_dim = n_embd / n_head: 128 at both paper sizes
    n_embd: int = 768
    block_size: int = 2048        # the training context
    window_pattern: str = "SSSL"  # tiled over layers: L sees the whole context, S a quarter; the last layer is L
    # The value vectors (Section 3); the defaults are standard attention.
    bov_layers: str | tuple = "none"  # target layers: last_third | every_other | all | none | indices (8, 9, ...)
    value_source: str = "table"   # V~: table E_v[i] (BoV) | x0 (x0 W_V) | v1 (layer 0's V) | x (V itself)
    value_mix: str = "replace"    # replace: v = c V~ | add: v = a V + b V~
    value_coeff: str = "learned"  # learned (c = a = 1, b = 0 at init) | fixed (c = 1; a = b = 0.5) | gated
    shared_table: bool = False    # one E_v for all target layers instead of one per layer (Fig 5b)

    def __post_init__(self):
        spec = self.bov_layers
        if isinstance(spec, str) and spec[:1].isdigit():  # "8,9,10,11" from a command line
            spec = spec.split(",")
        if not isinstance(spec, str):
            self.bov_layers = tuple(map(int, [spec] if isinstance(spec, int) else spec))
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if value not in choices and not (name == "bov_layers" and isinstance(value, tuple)):
                raise ValueError(f"{name}={value!r}: choose one of {', '.join(choices)}"
                                 + " or a list of layer indices" * (name == "bov_layers"))
        L, targets = self.n_layer, self.target_layers()
        if not all(0 <= i < L for i in targets):
            raise ValueError(f"bov_layers={self.bov_layers!r}: a {L}-layer model has layers 0 to {L - 1}")
        if self.value_source == "v1" and 0 in targets:
            raise ValueError("value_source=v1 cannot target layer 0, which computes V1")
        if self.value_coeff == "gated" and (self.value_source, self.value_mix) != ("table", "add"):
            raise ValueError("value_coeff=gated is nanochat's value embedding: value_source=table, value_mix=add")
        if self.shared_table and self.value_source != "table":
            raise ValueError("shared_table needs value_source=table")
        assert self.n_embd % self.n_head == 0 and self.head_dim % 2 == 0, "n_head must split n_embd in even heads"

    @classmethod
    def preset(cls, size, variant="baseline", **overrides):
        """A size from SIZES, a variant from VARIANTS, then any GPTConfig field."""
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        names = [f.name for f in fields(cls)]
        for key in overrides:
            if key not in names:
                raise ValueError(f"unknown GPTConfig field {key!r}; fields are {', '.join(names)}")
        return cls(**{**SIZES[size], **VARIANTS[variant], **overrides})

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    def target_layers(self):
        """The layers whose value vectors the variant changes (Table 1's "Target")."""
        L, spec = self.n_layer, self.bov_layers
        if spec == "last_third":
            return tuple(range(2 * L // 3, L))
        if spec == "every_other":  # the last layer and every second one below it, as the authors' code picks
            return tuple(range((L - 1) % 2, L, 2))
        if spec == "all":  # but layer 0 where it computes V1
            return tuple(range(int(self.value_source == "v1"), L))
        return () if spec == "none" else tuple(sorted(set(spec)))

    def table_layers(self):
        """Target layers that read a value table (BoV's E_v, or nanochat's value embeddings)."""
        return self.target_layers() if self.value_source == "table" else ()

    def n_tables(self):
        return min(1, len(self.table_layers())) if self.shared_table else len(self.table_layers())

    def v_free_layers(self):
        """Layers with no W_V and no V cache: their V is replaced by a table row or by layer 0's V1."""
        replaced = self.value_mix == "replace" and self.value_source in ("table", "v1")
        return self.target_layers() if replaced else ()

    def caches_ids(self):
        """Whether the decode cache keeps the token ids: a V-free table layer reads its window's rows by id."""
        return bool(self.table_layers() and self.v_free_layers())

    def windows(self):
        """Each layer's attention window in tokens, the query included (nanochat's SSSL)."""
        short = min(math.ceil(self.block_size / 4 / 128) * 128, self.block_size)  # a quarter, rounded up to 128
        w = [short if self.window_pattern[i % len(self.window_pattern)] == "S" else self.block_size
             for i in range(self.n_layer)]
        return w[:-1] + [self.block_size]

    def kv_cache_bytes(self, batch, context, dtype=torch.bfloat16):
        """The decode cache: K in every layer, V in all but the V-free ones, an int32 id if caches_ids()."""
        per_token = (2 * self.n_layer - len(self.v_free_layers())) * self.n_embd * dtype.itemsize
        return batch * context * (per_token + 4 * self.caches_ids())

    def table_bytes(self, dtype=torch.bfloat16):
        """The value tables, n_tables x |V| x d, shared by every sequence. Against the (L/3) d T bytes of V that
        BoV does not cache, they pay off from T = |V| for one sequence, from B T = |V| for B sequences (eq. 6)."""
        return self.n_tables() * self.vocab_size * self.n_embd * dtype.itemsize


# The paper's two models (Table 6) and one that trains in minutes on 2 CPU cores (6 layers: a last third of 2).
SIZES = {
    "paper_135m": dict(n_layer=12, n_embd=768, n_head=6, vocab_size=32768, block_size=2048),
    "paper_780m": dict(n_layer=24, n_embd=1536, n_head=12, vocab_size=32768, block_size=2048),
    "cpu": dict(n_layer=6, n_embd=192, n_head=6, vocab_size=4096, block_size=256),
}


def _v(layers, source, mix="replace", coeff="learned", **kw):
    return dict(bov_layers=layers, value_source=source, value_mix=mix, value_coeff=coeff, **kw)


# The paper's "last 4" of 12 layers is last_third, its "every 2" every_other.
VARIANTS = {
    "baseline": {},
    "bov": _v("last_third", "table"),                            # BoV: v = gamma_v E_v[i] (eq. 5)
    # Table 1, rows 1-13 (135M, 1.5e18 FLOPs)
    "t1_r01": {},                                                # V: standard attention
    "t1_r02": _v("last_third", "x"),                             # gamma_v V
    "t1_r03": _v("all", "v1", coeff="fixed"),                    # V1 in every layer after layer 0
    "t1_r04": _v("every_other", "v1"),                           # gamma_v V1, every 2
    "t1_r05": _v("last_third", "v1", coeff="fixed"),             # V1
    "t1_r06": _v("last_third", "v1"),                            # gamma_v V1
    "t1_r07": _v("every_other", "x0"),                           # gamma_v x0 W_V, every 2
    "t1_r08": _v("last_third", "x0", coeff="fixed"),             # x0 W_V
    "t1_r09": _v("last_third", "x0"),                            # gamma_v x0 W_V
    "t1_r10": _v("last_third", "v1", "add", "fixed"),            # 0.5 V + 0.5 V1
    "t1_r11": _v("last_third", "v1", "add"),                     # a V + b V1
    "t1_r12": _v("last_third", "x0", "add", "fixed"),            # 0.5 V + 0.5 x0 W_V
    "t1_r13": _v("last_third", "x0", "add"),                     # a V + b x0 W_V
    # Fig 5b: BoV's components
    "bov_shared_table": _v("last_third", "table", shared_table=True),  # one table for all target layers
    "bov_fixed_coeff": _v("last_third", "table", coeff="fixed"),  # v = E_v[i], no gamma_v
    "bov_every_layer": _v("all", "table"),                       # a table in every layer
    "bov_keep_v": _v("last_third", "table", "add"),              # v = a V + b E_v[i]
    # Prior methods (Sections 1, 6; Tables 3, 5)
    "value_embed_gated": _v("every_other", "table", "add", "gated"),  # nanochat's value embeddings: V + g(x) E[i]
    "resformer": _v("all", "v1", "add", "fixed"),                # value residual learning: 0.5 V + 0.5 V1
    "svformer": _v("all", "v1", coeff="fixed"),                  # SVFormer (Fig 1b): V1 replaces V, as t1_r03
}

# -----------------------------------------------------------------------------
# Building blocks


def norm(x):
    """RMSNorm without learnable weights."""
    return F.rms_norm(x, (x.size(-1),))


def rope_tables(seq_len, head_dim, base=100_000, device=None):
    """cos, sin, each (seq_len, head_dim / 2), of the rotary position embedding."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate the two halves of each head of x (B, T, H, D) by position; cos, sin are (T, D/2)."""
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


def window_mask(q_pos, k_pos, window):
    """(Tq, Tk) boolean mask: the query at position p sees the keys in (p - window, p]."""
    diff = q_pos[:, None] - k_pos[None, :]
    return (diff >= 0) & (diff < window)


class KVCache:
    """The decode cache of `batch` sequences of up to `max_len` tokens: K of every layer and V of every layer
    that is not V-free, each (B, H, max_len, D). A V-free table layer keeps no V: at each step it reads its
    window's E_v rows again by token id, kept once for the whole model, (B, max_len) int32 (Section 4)."""

    def __init__(self, config, batch, max_len, dtype, device):
        assert 0 < max_len <= config.block_size, f"a cache holds 1 to {config.block_size} positions"
        shape = (batch, config.n_head, max_len, config.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        self.v = [None if i in config.v_free_layers() else torch.empty(shape, dtype=dtype, device=device)
                  for i in range(config.n_layer)]
        self.ids = torch.empty(batch, max_len, dtype=torch.int32, device=device) if config.caches_ids() else None
        self.pos, self.max_len = 0, max_len  # positions written so far, and room

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.k + self.v + [self.ids] if t is not None)


class TableOffload:
    """The value tables kept in host memory while the rest of the model runs on `device`. The lookup needs
    only token ids, known before the pass reaches a table layer (Section 4): `fetch(ids)` copies the rows of
    the ids not seen before, of every table at once, into a device row cache, and gives each id's row there.
    Each distinct token's rows cross once: `rows` holds all that was fetched. For inference: the layers read
    a copy, so no gradient reaches the tables."""

    def __init__(self, tables, device):
        self.host = torch.stack([t.detach().cpu() for t in tables])  # (n_tables, |V|, C)
        n, V, C = self.host.shape
        self.rows = torch.empty(n, 0, C, dtype=self.host.dtype, device=device)  # (n_tables, rows fetched, C)
        self.slot = torch.full((V,), -1)  # token id -> its row in self.rows (-1: not fetched)

    def fetch(self, ids):
        ids = ids.cpu().long()  # one device -> host read
        new = ids.unique()
        new = new[self.slot[new] < 0]
        if len(new):
            self.slot[new] = torch.arange(self.rows.size(1), self.rows.size(1) + len(new))
            self.rows = torch.cat([self.rows, self.host[:, new].to(self.rows.device)], dim=1)
        return self.slot[ids].to(self.rows.device)


@dataclass
class Pass:
    """What the blocks of one forward pass read besides their input x."""
    ids: torch.Tensor            # (B, T) the tokens' rows in the value tables: their ids, or slots if offloaded
    x0: torch.Tensor             # (B, T, C) RMSNorm(wte[ids]): the context-free input of the x0 variants
    cos: torch.Tensor            # (T, D/2) rotary tables at this pass's positions
    sin: torch.Tensor
    tables: list                 # the value tables (rows, C): parameters, or the device rows of offloaded ones
    cache: KVCache | None
    v1: torch.Tensor | None = None  # (B, T, H, D) layer 0's V, for the "v1" variants; layer 0 sets it


class Attention(nn.Module):
    """Causal self-attention with RoPE, QK-norm and a sliding window. In a target layer the values come
    from `value()`, the paper's grid; elsewhere V = x W_V."""

    def __init__(self, config, layer, window):
        super().__init__()
        C = config.n_embd
        self.layer, self.window, self.n_head, self.head_dim = layer, window, config.n_head, config.head_dim
        self.target = layer in config.target_layers()
        self.source, self.mix, self.coeff = ((config.value_source, config.value_mix, config.value_coeff)
                                             if self.target else ("x", "replace", "fixed"))
        self.v_free = layer in config.v_free_layers()
        if self.source == "table":  # which of GPT.tables it reads
            self.table = 0 if config.shared_table else config.table_layers().index(layer)
        self.c_q = nn.Linear(C, C, bias=False)
        self.c_k = nn.Linear(C, C, bias=False)
        self.c_v = None if self.v_free else nn.Linear(C, C, bias=False)
        self.c_proj = nn.Linear(C, C, bias=False)
        if self.coeff == "learned":  # one free scalar each, unbounded (GPT.init_weights sets them)
            if self.mix == "replace":
                self.gamma_v = nn.Parameter(torch.empty(1))
            else:
                self.alpha_v = nn.Parameter(torch.empty(1))  # a, on V
                self.beta_v = nn.Parameter(torch.empty(1))   # b, on V~
        if self.coeff == "gated":
            self.ve_gate = nn.Linear(12, self.n_head, bias=False)  # reads x's first 12 channels (nanochat)

    def value(self, x, p):
        """The value vectors (B, T, H, D) of this pass's tokens. In a replace layer this is V~ before its
        coefficient c, which forward() applies to the attention's output (attention is linear in V)."""
        heads = lambda t: t.view(*t.shape[:-1], self.n_head, self.head_dim)  # (B, T, C) -> (B, T, H, D)
        if self.source == "table":
            tilde = heads(F.embedding(p.ids, p.tables[self.table]))  # E_v[i_p]: a lookup, no matmul
        elif self.source == "x0":
            tilde = heads(self.c_v(p.x0))                   # x0 W_V
        elif self.source == "v1":
            tilde = p.v1                                    # layer 0's V
        else:
            tilde = heads(self.c_v(x))                      # V = x W_V (eq. 1)
        if self.mix == "replace":
            return tilde
        v = heads(self.c_v(x))
        if self.coeff == "gated":  # nanochat's value embedding: V + 3 sigmoid(W_g x[:12]) E[i], one gate per head
            return v + 3 * torch.sigmoid(self.ve_gate(x[..., :12])).unsqueeze(-1) * tilde
        a, b = (self.alpha_v, self.beta_v) if self.coeff == "learned" else (0.5, 0.5)
        return a * v + b * tilde

    def forward(self, x, p):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)  # (B, T, H, D)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        q = norm(apply_rope(q, p.cos, p.sin)).transpose(1, 2)  # (B, H, T, D)
        k = norm(apply_rope(k, p.cos, p.sin)).transpose(1, 2)
        v = None if self.v_free and p.cache is not None else self.value(x, p)  # decode reads them in attend_cached
        if self.layer == 0:
            p.v1 = v
        if p.cache is not None:
            y = self.attend_cached(q, k, v, p)
        else:  # causal, and within the window where that is shorter
            pos = torch.arange(T, device=x.device)
            mask = None if self.window >= T else window_mask(pos, pos, self.window)
            y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), attn_mask=mask, is_causal=mask is None)
        if self.mix == "replace" and self.coeff == "learned":
            y = self.gamma_v * y  # v = gamma_v V~, applied here only: softmax(q k^T) (c V~) = c softmax(q k^T) V~
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, H, T, D) -> (B, T, C)

    def attend_cached(self, q, k, v, p):
        """Attention of this pass's queries over the cache: write K (and V where kept), read the window back."""
        cache, B, T = p.cache, q.size(0), q.size(2)
        t0, t1 = cache.pos, cache.pos + T
        start = max(0, t0 + 1 - self.window)  # the oldest key the first query sees
        cache.k[self.layer][:, :, t0:t1] = k
        keys = cache.k[self.layer][:, :, start:t1]  # (B, H, W, D)
        if cache.v[self.layer] is not None:  # this layer's own V
            cache.v[self.layer][:, :, t0:t1] = v.transpose(1, 2)
            values = cache.v[self.layer][:, :, start:t1]
        elif self.source == "v1":
            values = cache.v[0][:, :, start:t1]
        elif T == 1:
            return self.bag_step(q, keys, cache.ids[:, start:t1], p)
        else:  # a prefill of a table layer: the window's rows, read by id
            values = F.embedding(cache.ids[:, start:t1], p.tables[self.table])  # (B, W, C)
            values = values.view(B, t1 - start, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, W, D)
        mask = None if T == 1 else window_mask(torch.arange(t0, t1, device=q.device),
                                               torch.arange(start, t1, device=q.device), self.window)
        return F.scaled_dot_product_attention(q, keys, values.to(q.dtype), attn_mask=mask)

    def bag_step(self, q, keys, ids, p):
        """One decode step of a V-free table layer, sum_j p_j E_v[i_j] over the window, without writing the
        window's values out: the softmax weights p are the per-sample weights of one embedding_bag, which reads
        each row once. The (N, C) table is viewed as (N H, D): head h of row r is its row H r + h."""
        B, H, W, D = keys.shape
        wide = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):  # scores and p in float32, as SDPA keeps them
            probs = torch.softmax(q.to(wide) @ keys.to(wide).transpose(-1, -2) * D ** -0.5, dim=-1)  # (B, H, 1, W)
        bags = ids[:, None, :].long() * H + torch.arange(H, device=q.device)[:, None]  # (B, H, W) rows of (N H, D)
        table = p.tables[self.table].detach()  # detached: embedding_bag's forward-only kernel
        y = F.embedding_bag(bags.flatten(), table.view(-1, D), torch.arange(0, B * H * W, W, device=q.device),
                            mode="sum", per_sample_weights=probs.flatten().to(table.dtype))  # (B H, D)
        return y.view(B, H, 1, D).to(q.dtype)


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

    def forward(self, x, p):
        x = x + self.attn(norm(x), p)
        return x + self.mlp(norm(x))

# -----------------------------------------------------------------------------
# The model


class GPT(nn.Module):

    def __init__(self, config, device=None):
        """Build on `device` (default CPU) and initialise; device="meta" gives the shapes alone, for parameter
        counts and FLOPs of any size without memory."""
        super().__init__()
        self.config = config
        with torch.device("meta"):
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.blocks = nn.ModuleList(Block(config, i, w) for i, w in enumerate(config.windows()))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            # the value tables (|V| x d): one per table layer, or one shared by all
            self.tables = nn.ModuleList(nn.Embedding(config.vocab_size, config.n_embd)
                                        for _ in range(config.n_tables()))
        self.offload = None  # a TableOffload once offload_tables() has run
        device = torch.device(device or "cpu")
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights()
        cos, sin = rope_tables(config.block_size, config.head_dim, device=device)  # derived: not in checkpoints
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self):
        """nanochat's initialisation (from before March 2026), drawn from torch's global RNG in this order:
            wte normal(std 1); lm_head normal(std 0.001); c_q, c_k, W_V, c_fc uniform(-s, s), s = sqrt(3 / d);
            both c_proj zero (every block starts as the identity); gamma_v = a = 1, b = 0 (c = 1 makes BoV's
            first pass equal x0 W_V); ve_gate uniform(0, 0.02) (a gate of about 1.5); E_v = RMSNorm(wte) W_V of
            its layer (Section 5; a shared table: the first target layer's); gated value embeddings uniform(-s, s).
        Every layer draws a W_V, used or not, so that every variant starts from the baseline's weights from the
        same seed (all but value_embed_gated, whose gates draw inside the loop)."""
        s = math.sqrt(3 / self.config.n_embd)
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        w_v = []
        for block in self.blocks:
            a = block.attn
            nn.init.uniform_(a.c_q.weight, -s, s)
            nn.init.uniform_(a.c_k.weight, -s, s)
            w_v.append(nn.init.uniform_(torch.empty_like(a.c_q.weight), -s, s))
            if a.c_v is not None:
                a.c_v.weight.copy_(w_v[-1])
            nn.init.zeros_(a.c_proj.weight)
            nn.init.uniform_(block.mlp.c_fc.weight, -s, s)
            nn.init.zeros_(block.mlp.c_proj.weight)
            for name, value in (("gamma_v", 1.0), ("alpha_v", 1.0), ("beta_v", 0.0)):
                if hasattr(a, name):
                    getattr(a, name).fill_(value)
            if hasattr(a, "ve_gate"):
                nn.init.uniform_(a.ve_gate.weight, 0.0, 0.02)
        x0 = norm(self.wte.weight)  # (|V|, C): the x0 of every token id
        for t, table in enumerate(self.tables):
            if self.config.value_coeff == "gated":
                nn.init.uniform_(table.weight, -s, s)
            else:
                table.weight.copy_(x0 @ w_v[self.config.table_layers()[t]].T)

    def forward(self, idx, targets=None, cache=None):
        """idx (B, T) -> logits (B, T, |V|) and, given targets (-1: ignored), their mean cross-entropy.
        With a KVCache, idx goes at cache.pos and only the last position's logits come back (B, 1, |V|)."""
        T = idx.size(1)
        pos = 0 if cache is None else cache.pos
        assert pos + T <= (self.config.block_size if cache is None else cache.max_len), "past the context"
        ids, tables = idx, [t.weight for t in self.tables]
        if self.offload is not None:  # the rows of new ids cross before the layers need them
            ids, tables = self.offload.fetch(idx), list(self.offload.rows)
        if cache is not None and cache.ids is not None:
            cache.ids[:, pos:pos + T] = ids
        x = x0 = norm(self.wte(idx))
        p = Pass(ids, x0, self.cos[pos:pos + T], self.sin[pos:pos + T], tables, cache)
        for block in self.blocks:
            x = block(x, p)
        if cache is not None:
            cache.pos += T
            x = x[:, -1:]  # generation needs the next token only: skip the head for the prompt's other positions
        logits = self.lm_head(norm(x)).float()
        logits = 15 * torch.tanh(logits / 15)  # soft-cap to (-15, 15)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)

    def offload_tables(self, device):
        """Run on `device` with the value tables left in host memory (TableOffload). Call it last: a .to()
        after it would move the tables apart from the host copy that the layers read."""
        for name, child in self.named_children():
            if name != "tables":
                child.to(device)
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        if len(self.tables):
            self.offload = TableOffload([t.weight for t in self.tables], device)
            for table, host in zip(self.tables, self.offload.host):
                table.weight.data = host  # one host copy: the parameters become views of it
        return self

    def configure_optimizers(self, matrix_lr=0.02, embedding_lr=0.30, unembedding_lr=0.008, scalar_lr=0.50,
                             table_lr=0.15, weight_decay=0.28):
        """Table 6 (defaults: its 135M column; table_lr is Section 5's): torch.optim.Muon on every 2-D block
        matrix, with decoupled weight decay; AdamW without decay on the embedding, lm_head, value tables and
        scalar coefficients, whose first three rates scale by (n_embd / 768)^-0.5 as in nanochat. Muon's
        momentum 0.95 and AdamW's betas (0.8, 0.95) are nanochat's (README, "Differences"). -> [muon, adamw]"""
        scale = (self.config.n_embd / 768) ** -0.5
        matrices = [p for p in self.blocks.parameters() if p.dim() == 2]
        groups = [dict(params=[self.wte.weight], lr=embedding_lr * scale),
                  dict(params=[self.lm_head.weight], lr=unembedding_lr * scale),
                  dict(params=list(self.tables.parameters()), lr=table_lr * scale),
                  dict(params=[p for p in self.blocks.parameters() if p.dim() < 2], lr=scalar_lr)]
        groups = [g for g in groups if g["params"]]
        assert len(matrices) + sum(len(g["params"]) for g in groups) == len(list(self.parameters())), \
            "a parameter outside the blocks needs its optimizer group here"
        muon = torch.optim.Muon(matrices, lr=matrix_lr, momentum=0.95, nesterov=True, weight_decay=weight_decay)
        adamw = torch.optim.AdamW(groups, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0,
                                  fused=self.wte.weight.device.type in ("cpu", "cuda"))
        for opt in (muon, adamw):
            for g in opt.param_groups:
                g["initial_lr"] = g["lr"]
        return [muon, adamw]

    @classmethod
    def from_checkpoint(cls, path, device="cpu"):
        """A train.py checkpoint (the file, or the run's out_dir) -> (model in eval mode on device, checkpoint)."""
        if os.path.isdir(path):
            path = os.path.join(path, "ckpt.pt")
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        config = GPTConfig(**ckpt["model_config"])
        model = cls(config, device="meta")
        model.load_state_dict(ckpt["model"], assign=True)
        model.cos, model.sin = rope_tables(config.block_size, config.head_dim)
        return model.to(device).eval(), ckpt

    def new_cache(self, batch, max_len=None):
        """A KVCache in the dtype of the keys it will hold: autocast's, or the weights'."""
        w = self.wte.weight
        dtype = torch.get_autocast_dtype(w.device.type) if torch.is_autocast_enabled(w.device.type) else w.dtype
        return KVCache(self.config, batch, max_len or self.config.block_size, dtype, w.device)

    @torch.no_grad()
    def stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None):
        """Yield max_new_tokens new tokens (B, 1), one at a time, after the prompt idx (B, T). With the cache
        the prompt is prefilled once, then each step feeds one token; a full cache starts again from the last
        half block. Without it every step reruns the last block_size tokens. temperature 0 is greedy."""
        block, V = self.config.block_size, self.config.vocab_size
        if idx.min() < 0 or idx.max() >= V:
            raise ValueError(f"token ids must be in [0, {V}), the vocabulary; got {idx.min()} to {idx.max()}")
        cache = None
        for _ in range(max_new_tokens):
            if not use_cache:
                logits, _ = self(idx[:, -block:])
            elif cache is None or cache.pos == cache.max_len:
                context = idx[:, -block:] if cache is None else idx[:, -(block // 2):]
                cache = self.new_cache(idx.size(0))
                logits, _ = self(context, cache=cache)
            else:
                logits, _ = self(idx[:, -1:], cache=cache)
            logits = logits[:, -1]  # (B, |V|)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, -float("inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
            yield nxt

    def generate(self, idx, max_new_tokens, **kwargs):
        """idx (B, T) followed by max_new_tokens sampled tokens: (B, T + max_new_tokens). See stream()."""
        return torch.cat([idx, *self.stream(idx, max_new_tokens, **kwargs)], dim=1)

    def num_params(self):
        """{"dense": every parameter but the tables', "tables": the value tables' entries,
        "scaling": the matmul weights (block matrices and lm_head), Table 6's tokens-per-parameter base}."""
        tables = sum(p.numel() for p in self.tables.parameters())
        scaling = self.lm_head.weight.numel() + sum(p.numel() for p in self.blocks.parameters() if p.dim() == 2)
        return dict(dense=sum(p.numel() for p in self.parameters()) - tables, tables=tables, scaling=scaling)

    def estimate_flops(self):
        """Training FLOPs per token, forward and backward, as nanochat counts them: 6 x the weights of the
        matmuls (block matrices and lm_head; W_V twice where it multiplies both x and x0; never a lookup of
        wte or a table) + 12 n_head head_dim window per layer for attention's scores and values."""
        cfg = self.config
        matmul = self.num_params()["scaling"]
        matmul += sum(b.attn.c_v.weight.numel() for b in self.blocks if (b.attn.source, b.attn.mix) == ("x0", "add"))
        return 6 * matmul + sum(12 * cfg.n_embd * w for w in cfg.windows())

    def coefficients(self):
        """{layer: {"gamma_v": c} or {"alpha_v": a, "beta_v": b}}: the learned coefficients (Fig 2)."""
        names = ("gamma_v", "alpha_v", "beta_v")
        return {i: {n: getattr(b.attn, n).item() for n in names if hasattr(b.attn, n)}
                for i, b in enumerate(self.blocks) if any(hasattr(b.attn, n) for n in names)}


def load_tokenizer(tok):
    """The tiktoken Encoding of prepare_data.py's tokenizer.json, which every checkpoint carries: the bytes of
    each ordinary token by id (base64), then the one special token, <|bos|>, at the last id."""
    ranks = {base64.b64decode(b): i for i, b in enumerate(tok["ranks"])}
    return tiktoken.Encoding("bov", pat_str=tok["pattern"], mergeable_ranks=ranks,
                             special_tokens={tok["bos"]: len(ranks)})


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="List the presets: target layers, parameters and FLOPs per token.")
    ap.add_argument("--size", default="paper_135m", choices=list(SIZES))
    size = ap.parse_args().size
    print(f"size {size}: {SIZES[size]}")
    print(f"{'variant':<18} {'target layers':<22} {'dense params':>13} {'table params':>13} {'FLOPs/token':>15}")
    for name in VARIANTS:
        cfg = GPTConfig.preset(size, name)
        m = GPT(cfg, device="meta")
        n = m.num_params()
        layers = ",".join(map(str, cfg.target_layers())) or "-"
        print(f"{name:<18} {layers:<22} {n['dense']:>13,} {n['tables']:>13,} {m.estimate_flops():>15,}")
