"""Tests of model.py: the architecture, the value-vector grid, decoding with a KV cache, accounting."""

import argparse
import contextlib
import errno
import io
import math
import os
import re
import runpy
import subprocess
import sys
import warnings
import zipfile

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.serialization import config as serialization_config

from bench import SDPA_FLOPS  # SDPA for the counter, backward = 2 x forward (nanochat's count) on CPU and CUDA
from conftest import builds, finish, flip_tensor_byte, set_compression_method
import model as model_module
from model import (GPT, GPTConfig, KVCache, PassContext, SIZES, TableOffload, TORCH_LEGACY_MAGIC, VARIANTS,
                   unreadable_checkpoint, widest_float)

# A tiny model that still has sliding windows: block 256 gives S windows of 128 tokens.
TINY = dict(n_layer=6, n_embd=48, n_head=4, vocab_size=97, block_size=256, window_pattern="SSSL")


def tiny(variant="baseline", **kw):
    return GPTConfig.preset("cpu", variant, **{**TINY, **kw})


def fits_tiny(variant):
    """Whether the 6-layer test model has the variant's target layers."""
    return builds("cpu", variant, **TINY)


def at_tiny(variants=VARIANTS, where=lambda cfg: True):
    """pytest params of the variants whose test-model config satisfies `where`; one whose layers the test model
    lacks is skipped with its reason (not left out unseen, and not failing the whole file at collection); any other
    refusal of a variant stops the run at collection, naming it."""
    return [v if fits_tiny(v) else pytest.param(v, marks=pytest.mark.skip(
        reason=f"{v}'s layers {VARIANTS[v]['bov_layers']} are not in the {TINY['n_layer']}-layer test model"))
            for v in variants if not fits_tiny(v) or where(tiny(v))]


def test_only_a_variant_whose_layers_are_past_the_depth_is_skipped(monkeypatch):
    """conftest.builds: a variant listing layers the size lacks does not build there (its tests skip it); any other
    mistake in a variant is raised, failing the tests rather than skipping them."""
    monkeypatch.setitem(VARIANTS, "deep", dict(VARIANTS["bov"], bov_layers=(8, 9)))
    monkeypatch.setitem(VARIANTS, "typo", dict(VARIANTS["bov"], value_source="tabel"))
    assert builds("paper_135m", "deep") and not builds("cpu", "deep") and not fits_tiny("deep")
    assert at_tiny(["bov", "deep"])[0] == "bov" and at_tiny(["bov", "deep"])[1].marks[0].name == "skip"
    for layers in ("8,9", 8, [3, 8]):  # every spelling GPTConfig takes
        assert not builds("cpu", "bov", bov_layers=layers) and builds("paper_135m", "bov", bov_layers=layers)
    assert not builds("cpu", "bov", n_layer=4, bov_layers=(4, 5)) and builds("cpu", "bov", n_layer=8, bov_layers=(6, 7))
    with pytest.raises(ValueError, match="value_source must be 'table', 'x0', 'v1' or 'x', got 'tabel' \\(size cpu, variant typo\\)$"):
        builds("cpu", "typo")


def seeded(seed, variant="baseline", **kw):
    """GPT(tiny(variant, **kw)) made right after torch.manual_seed(seed): models of two variants from one seed
    start with the same values in every weight they share."""
    torch.manual_seed(seed)
    return GPT(tiny(variant, **kw))


def build(cfg, seed=0, randomize=True):
    """A float64 model whose weights are all random (no zero projections), so logits are well separated."""
    torch.manual_seed(seed)
    model = GPT(cfg).double()
    if randomize:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0, 1 / math.sqrt(p.size(1)), generator=g)
                else:  # coefficients: move them off their init so they matter
                    p.uniform_(0.5, 1.5, generator=g)
    return model.eval()


def batch(cfg, B=2, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, T), generator=g)


# ---------------------------------------------------------------------------- presets

def test_sizes_and_variants_are_the_documented_names():
    """The README's variant table lists every preset once (a new variant needs its row there)."""
    assert list(SIZES) == ["paper_135m", "paper_780m", "cpu"]
    documented = [name for names, _, _ in readme_variant_rows() for name in names]
    assert len(documented) == len(set(documented)), "a variant listed twice in the README's table"
    assert not set(VARIANTS) - set(documented), f"VARIANTS not in the README's variant table: {set(VARIANTS) - set(documented)}"
    assert not set(documented) - set(VARIANTS), f"README variants not in VARIANTS: {set(documented) - set(VARIANTS)}"
    assert {"baseline", "bov", "t1_r13", "svformer"} <= set(VARIANTS)


def test_sizes_are_the_documented_shapes():
    """README's sizes: paper_135m 12 layers, d 768, 6 heads of 128, context 2048, SSSL; paper_780m 24 layers,
    d 1536, 12 heads (of 128 again); cpu 6 layers, d 192, 6 heads, context 256."""
    shapes = {name: (c.n_layer, c.n_embd, c.n_head, c.head_dim, c.block_size, c.window_pattern)
              for name in SIZES for c in [GPTConfig.preset(name)]}
    assert shapes == {"paper_135m": (12, 768, 6, 128, 2048, "SSSL"), "paper_780m": (24, 1536, 12, 128, 2048, "SSSL"),
                      "cpu": (6, 192, 6, 32, 256, "SSSL")}


def readme_variant_rows():
    """[(variant names, target layers text, value text)] of the README's variant table."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")) as f:
        table = f.read().split("| variant | paper |", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in row.split("|")[1:-1]] for row in table.splitlines()[2:]]
    return [(re.findall(r"`(\w+)`", name), layers, value) for name, _, layers, value in rows]


def value_formula(c):
    """A target layer's value in the README table's notation, from the config and, for a fixed coefficient, its value
    in Attention.coefficients() (1 is not written: `V1`, `2 V1`, `0.5 V + 0.5 V1`)."""
    tilde = {"table": "E[i]" if c.shared_table else "E_v[i]", "x0": "x0 W_V", "v1": "V1", "x": "V"}.get(c.value_source)
    assert tilde, f"value_formula (test_model.py) has no notation for value_source {c.value_source!r}: add it there"
    if c.value_coeff == "gated":
        return "V + 3σ(W_g x[:12]) E[i] per head"
    if c.value_coeff == "learned":
        coeffs = ("γ",) if c.value_mix == "replace" else ("a", "b")
    else:
        coeffs = [f"{float(x):g}" for x in GPT.meta(c).blocks[c.target_layers()[0]].attn.coefficients()]
    written = lambda coeff, v: v if coeff == "1" else f"{coeff} {v}"
    if c.value_mix == "add":
        return f"{written(coeffs[0], 'V')} + {written(coeffs[1], tilde)}"
    return written(coeffs[0], tilde) + (", one table for all target layers" * c.shared_table)


def test_variants_are_the_readme_table_rows():
    """Each preset's target layers (at the 12-layer size) and value formula are its row of the README's table,
    the formula written out from the config (value_formula) and compared as text."""
    named = {"—": (), "last third": tuple(range(8, 12)), "every other": tuple(range(1, 12, 2)),
             "all but 0": tuple(range(1, 12)), "all": tuple(range(12))}
    for names, where, values in readme_variant_rows():
        listed = tuple(int(i) for i in re.findall(r"\d+", where))  # a new variant's own indices, e.g. "4, 5"
        layers = named.get(where, listed)
        shared = values.endswith(", one table for all target layers")
        values = [values] if shared else values.split(", ")
        if names[0] == "baseline":
            values = values * len(names)
        assert len(values) == len(names), names
        for name, value in zip(names, values):
            c = GPTConfig.preset("paper_135m" if max(layers, default=0) < 12 else "paper_780m", name)
            assert c.target_layers() == layers, name
            assert value == (value_formula(c) if layers else "V"), name
            assert layers or (c.n_tables() == 0 and not c.v_free_layers()), name


def test_a_preset_that_does_not_fit_names_its_size_and_variant():
    with pytest.raises(ValueError, match=r"^bad GPTConfig: bov_layers as a list must hold distinct layer indices in \[0, 6\), "
                                         r"got \(8,\) \(size cpu, variant bov\)$"):
        GPTConfig.preset("cpu", "bov", bov_layers=(8,))
    with pytest.raises(ValueError, match=r"distinct layer indices in \[0, 6\), got \(4, 5, 5\)"):  # not read as (4, 5)
        GPTConfig.preset("cpu", "bov", bov_layers=[4, 5, 5])


@pytest.mark.parametrize("variant", at_tiny())
def test_every_preset_runs_with_a_finite_loss(variant):
    cfg = tiny(variant)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = batch(cfg, T=33)
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 33, cfg.vocab_size)
    assert loss.ndim == 0 and torch.isfinite(loss)
    # At init the lm_head is tiny, so the loss is close to uniform guessing.
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_target_layer_sets():
    c12 = GPTConfig.preset("paper_135m", "bov")
    c24 = GPTConfig.preset("paper_780m", "bov")
    assert c12.target_layers() == (8, 9, 10, 11)
    assert c24.target_layers() == tuple(range(16, 24))
    assert GPTConfig.preset("paper_135m", "value_embed_gated").target_layers() == (1, 3, 5, 7, 9, 11)
    assert GPTConfig.preset("paper_135m", "bov_every_layer").target_layers() == tuple(range(12))
    # a V1 source never targets layer 0: it produces V1
    assert GPTConfig.preset("paper_135m", "svformer").target_layers() == tuple(range(1, 12))
    assert GPTConfig.preset("paper_135m", "baseline", bov_layers=[9, 11]).target_layers() == (9, 11)
    # a command line's "9, 11" and a single index read the same way
    assert GPTConfig.preset("paper_135m", "baseline", bov_layers="9, 11").bov_layers == (9, 11)
    assert GPTConfig.preset("paper_135m", "baseline", bov_layers=11).bov_layers == (11,)
    for typo in ("4,", "4,,5", "4 5"):  # anything else is not a list: the message says what is
        with pytest.raises(ValueError, match=f"bov_layers must be 'last_third', .* got '{typo}'"):
            GPTConfig.preset("paper_135m", "baseline", bov_layers=typo)
    assert GPTConfig.preset("paper_135m", "baseline").target_layers() == ()
    listed = GPTConfig.preset("paper_135m", "bov", bov_layers=(11, 9))  # a list in any order (a repeat is refused)
    assert listed.target_layers() == (9, 11) and listed.n_tables() == 2
    for L in range(1, 25):  # at any depth: the last third (floor or ceil of L/3 layers); the last layer and every second below it
        t = GPTConfig.preset("cpu", "bov", n_layer=L).target_layers()
        assert t == tuple(range(L - len(t), L)) and L // 3 <= len(t) <= -(-L // 3), L
        assert GPTConfig.preset("cpu", "t1_r07", n_layer=L).target_layers() == tuple(range(L - 1, -1, -2))[::-1], L


def test_windows_follow_sssl_with_a_full_last_layer():
    c = GPTConfig.preset("paper_135m")
    assert c.windows() == [512, 512, 512, 2048] * 3
    c = GPTConfig.preset("paper_135m", window_pattern="S")
    assert c.windows() == [512] * 11 + [2048]
    assert GPTConfig.preset("cpu").windows() == [128, 128, 128, 256, 128, 256]
    assert GPTConfig.preset("cpu", block_size=64).windows() == [64] * 6  # a window never exceeds the context
    for block, short in ((1000, 256), (1536, 384), (640, 256), (2049, 640)):  # a quarter, rounded up to 128
        assert GPTConfig.preset("cpu", block_size=block).windows()[0] == short, block


def test_bov_layers_have_a_table_and_no_w_v():
    cfg = tiny("bov")
    model = GPT(cfg)
    for i, block in enumerate(model.blocks):
        if i in (4, 5):
            assert block.attn.c_v is None and block.attn.table_idx is not None
            assert block.attn.gamma_v.item() == 1.0
        else:
            assert block.attn.c_v is not None and block.attn.table_idx is None
    assert len(model.tables) == 2
    assert all(t.weight.shape == (cfg.vocab_size, cfg.n_embd) for t in model.tables)
    assert not any("c_v" in n for n in model.state_dict() if n.startswith(("blocks.4.", "blocks.5.")))
    assert len(GPT(tiny("bov_shared_table")).tables) == 1
    # add keeps W_V next to the table; V1-replace drops W_V
    keep = GPT(tiny("bov_keep_v"))
    assert keep.blocks[5].attn.c_v is not None and len(keep.tables) == 2
    assert GPT(tiny("svformer")).blocks[3].attn.c_v is None


# ---------------------------------------------------------------------------- the paper's init statement

def _same_nonzero_projections(*models):
    for m in models:
        g = torch.Generator().manual_seed(123)
        with torch.no_grad():
            for block in m.blocks:
                block.attn.c_proj.weight.normal_(0, 0.1, generator=g)
                block.mlp.c_proj.weight.normal_(0, 0.1, generator=g)
            m.lm_head.weight.normal_(0, 0.1, generator=g)


@pytest.mark.parametrize("shared", [False, True])
def test_bov_at_init_equals_x0_w_v(shared):
    """Section 5: E_v is initialised to RMSNorm(wte) W_V, so BoV's first forward equals x0 W_V.
    For the shared table the statement holds for the first target layer, so compare that one. To the bit over
    the whole vocabulary in one pass (the x0 variant's matmul then has the table init's shape and rows); in
    another batch up to float rounding, as a matmul's may depend on its shape (model.py's docstring)."""
    kw = dict(bov_layers=(5,)) if shared else {}
    bov = seeded(7, "bov_shared_table" if shared else "bov", **kw)
    x0 = seeded(7, "t1_r09", **kw)
    # The output projections start at zero; make them non-zero (identically) so V reaches the logits.
    _same_nonzero_projections(bov, x0)
    every_id = torch.arange(bov.config.vocab_size)[None]  # (1, |V|) <= block_size
    assert torch.equal(bov(every_id)[0], x0(every_id)[0])
    idx = batch(bov.config, T=64)
    lb, _ = bov(idx)
    lx, _ = x0(idx)
    torch.testing.assert_close(lb, lx, rtol=1e-5, atol=1e-5)
    # and the claim is not vacuous: the standard baseline from the same seed differs
    base = seeded(7, "baseline")
    _same_nonzero_projections(base)
    assert (base(idx)[0] - lb).abs().max() > 1e-3


TABLE_INIT_VARIANTS = at_tiny(where=lambda cfg: cfg.n_tables() and cfg.value_coeff != "gated")


@pytest.mark.parametrize("variant", TABLE_INIT_VARIANTS)
def test_table_rows_are_rms_norm_wte_times_w_v(variant):
    """Every table but the gated value embeddings' (uniform, as nanochat's) starts as RMSNorm(wte) W_V of
    its layer in the baseline from the same seed; a shared table as its first target layer's. Mutant:
    the init keyed on value_mix, so bov_keep_v's tables started uniform (its b = 0 hides it in the logits)."""
    assert {"bov", "bov_shared_table", "bov_keep_v", "bov_every_layer"} <= set(TABLE_INIT_VARIANTS)
    model, base = seeded(3, variant), seeded(3, "baseline")
    layers = model.config.table_layers()[:model.config.n_tables()]  # shared: the first target layer's
    assert len(layers) == len(model.tables) > 0
    for table, layer in zip(model.tables, layers):
        expected = torch.nn.functional.rms_norm(base.wte.weight, (48,)) @ base.blocks[layer].attn.c_v.weight.T
        torch.testing.assert_close(table.weight, expected)


@pytest.mark.parametrize("variant", at_tiny(where=lambda cfg: cfg.value_coeff != "gated"))
def test_every_variant_starts_from_the_baselines_weights(variant):
    """init_weights draws a W_V in every layer, used or not, so that one seed gives every variant the
    baseline's values in each weight they share (Table 1's rows differ only in the value path). Mutant:
    no W_V drawn for the layers that drop it (t1_r03, svformer), shifting every later weight."""
    base = dict(seeded(7, "baseline").named_parameters())
    params = dict(seeded(7, variant).named_parameters())
    for name, p in params.items():
        if name in base:
            assert torch.equal(p, base[name]), (f"{variant}'s {name} differs from the baseline's: init_weights must draw a "
                                                "new parameter's values after every draw the baseline makes")
    assert all(".attn.c_v." in name for name in set(base) - set(params))  # only a dropped W_V is missing


@pytest.mark.parametrize("variant", at_tiny())
def test_init_weights_sets_every_parameter(variant):
    """The model is built on the meta device, so a parameter that init_weights forgets keeps whatever memory
    to_empty left (often zeros: a new table would train from 0 unseen). Here that memory is NaN."""
    model = GPT.meta(tiny(variant))
    model.to_empty(device="cpu")
    for p in model.parameters():
        p.data.fill_(math.nan)
    model.init_weights()
    assert not [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]


LEARNED = at_tiny(where=lambda cfg: cfg.target_layers() and cfg.value_coeff == "learned")


@pytest.mark.parametrize("variant", LEARNED)
def test_learned_coefficients_get_a_gradient(variant):
    """eq. 5's gamma_v (and the add variants' alpha_v, beta_v) are trained parameters: each gets a non-zero
    gradient (mutant: gamma_v made with requires_grad=False, which turns BoV into bov_fixed_coeff and
    flattens Fig 2)."""
    assert {"bov", "t1_r04", "t1_r07", "t1_r11", "t1_r13", "bov_keep_v"} <= set(LEARNED)
    model = build(tiny(variant))
    idx = batch(model.config)
    model(idx, idx)[1].backward()
    coeffs = [getattr(b.attn, n) for b in model.blocks for n in ("gamma_v", "alpha_v", "beta_v") if hasattr(b.attn, n)]
    mix = 2 if model.config.value_mix == "add" else 1
    assert len(coeffs) == mix * len(model.config.target_layers())
    assert all(c.requires_grad and c.grad is not None and c.grad.abs().item() > 0 for c in coeffs)


def test_gamma_v_scales_the_table_values():
    """eq. 5: v = gamma_v E_v[i], and attention is linear in v: doubling gamma_v and halving W_O of the
    same layer leaves the logits unchanged; doubling gamma_v alone changes them."""
    model = build(tiny("bov"))
    idx = batch(model.config)
    before, _ = model(idx)
    attn = model.blocks[4].attn
    with torch.no_grad():
        attn.gamma_v.mul_(2)
        attn.c_proj.weight.div_(2)
    torch.testing.assert_close(model(idx)[0], before, rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        attn.gamma_v.mul_(2)
    assert (model(idx)[0] - before).abs().max() > 1e-3


def test_add_starts_as_standard_attention_and_fixed_add_is_half_half():
    """Table 1: learned add (a V + b V~, a = 1, b = 0) starts as the baseline; fixed add is 0.5 V + 0.5 V~."""
    base = seeded(7, "baseline")
    learned = seeded(7, "t1_r13")
    fixed = seeded(7, "t1_r12")
    _same_nonzero_projections(base, learned, fixed)
    idx = batch(base.config)
    torch.testing.assert_close(learned(idx)[0], base(idx)[0], rtol=0, atol=0)
    with torch.no_grad():
        for i in (4, 5):
            learned.blocks[i].attn.alpha_v.fill_(0.5)
            learned.blocks[i].attn.beta_v.fill_(0.5)
    torch.testing.assert_close(fixed(idx)[0], learned(idx)[0], rtol=0, atol=0)


def test_a_fixed_coefficient_is_the_learned_one_at_init():
    """Table 1's fixed c = 1 is the learned gamma_v at its init, and row 2's gamma_v V starts as the baseline:
    from one seed, each pair gives the same logits to the bit."""
    for learned, fixed in (("t1_r02", "baseline"), ("t1_r09", "t1_r08"), ("t1_r06", "t1_r05"), ("bov", "bov_fixed_coeff")):
        a, b = seeded(7, learned), seeded(7, fixed)
        _same_nonzero_projections(a, b)
        idx = batch(a.config)
        torch.testing.assert_close(a(idx)[0], b(idx)[0], rtol=0, atol=0)


def test_the_gate_is_3_sigmoid_of_the_first_12_channels():
    """nanochat's gated value embedding, v = V + 3 sigmoid(W_g x[:12]) E[i]: with W_g = 0 the gate is 1.5
    everywhere, the same model as learned add with a = 1, b = 1.5; W_g reads the layer's normed input."""
    gated = build(tiny("value_embed_gated", bov_layers=(4, 5)))
    add = build(tiny("bov_keep_v"))
    state = {k: v for k, v in gated.state_dict().items() if "ve_gate" not in k}
    for i in (4, 5):
        state[f"blocks.{i}.attn.alpha_v"] = torch.ones(1, dtype=torch.float64)
        state[f"blocks.{i}.attn.beta_v"] = torch.full((1,), 1.5, dtype=torch.float64)
    add.load_state_dict(state)
    with torch.no_grad():
        for i in (4, 5):
            gated.blocks[i].attn.ve_gate.weight.zero_()
    idx = batch(gated.config)
    torch.testing.assert_close(gated(idx)[0], add(idx)[0], rtol=1e-12, atol=1e-12)
    seen = {}
    gated.blocks[4].register_forward_pre_hook(lambda m, a: seen.update(block=a[0]))
    gated.blocks[4].attn.ve_gate.register_forward_pre_hook(lambda m, a: seen.update(gate=a[0]))
    gated(idx)
    torch.testing.assert_close(seen["gate"], torch.nn.functional.rms_norm(seen["block"], (48,))[..., :12])


def test_the_gate_is_one_scalar_per_head():
    """v = V + 3 sigmoid(W_g x[:12])_h E[i]_h: head h's slice of the table row has its own gate."""
    model = build(tiny("value_embed_gated"))
    attn, (B, T, H, D) = model.blocks[5].attn, (2, 8, 4, 12)
    idx = batch(model.config, B, T)
    x = torch.randn(B, T, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    v = attn.value(x, PassContext(ids=idx, x0=None, cos=None, sin=None, pos=0, table_rows=model.table_rows))
    gate = 3 * torch.sigmoid(x[..., :12] @ attn.ve_gate.weight.T)  # (B, T, H)
    assert gate.std(dim=-1).min() > 1e-3  # the heads' gates differ
    rows = model.tables[attn.table_idx].weight[idx].view(B, T, H, D)
    torch.testing.assert_close(v, (x @ attn.c_v.weight.T).view(B, T, H, D) + gate[..., None] * rows, rtol=1e-12, atol=1e-12)


def test_v1_variants_train_layer_0_w_v_through_the_later_layers():
    """V1 is layer 0's V itself, not a detached copy: with layer 0's own output cut (W_O = 0), its W_V
    still gets a gradient, through the target layers that reuse V1."""
    model = seeded(0, "t1_r06")
    _same_nonzero_projections(model)
    with torch.no_grad():
        model.blocks[0].attn.c_proj.weight.zero_()
    idx = batch(model.config)
    model(idx, idx)[1].backward()
    assert model.blocks[0].attn.c_v.weight.grad.abs().sum() > 0


def reference_logits(model, idx, windows=None):
    """The baseline trunk written out from the README's list (pre-norm RMSNorm blocks, RoPE with base
    100,000 then QK-norm, relu^2 MLP, final norm, untied head, soft-cap 15), every window full unless
    windows gives each layer's: the query at p sees the keys at p - window < j <= p."""
    F = torch.nn.functional
    cfg = model.config
    B, T = idx.shape
    H, D = cfg.n_head, cfg.head_dim
    rms = lambda t: F.rms_norm(t, (t.size(-1),))
    inv_freq = 100_000 ** -(torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]    # (1, T, 1, D/2)

    def rope(t):  # (B, T, H, D), the two halves rotated
        a, b = t[..., :D // 2], t[..., D // 2:]
        return torch.cat([a * cos + b * sin, b * cos - a * sin], dim=-1)

    back = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # p - j
    x = rms(model.wte.weight[idx])
    for layer, block in enumerate(model.blocks):
        seen = (back >= 0) & (back < (T if windows is None else windows[layer]))
        a, h = block.attn, rms(x)
        q = rms(rope((h @ a.c_q.weight.T).view(B, T, H, D))).transpose(1, 2)  # (B, H, T, D)
        k = rms(rope((h @ a.c_k.weight.T).view(B, T, H, D))).transpose(1, 2)
        v = (h @ a.c_v.weight.T).view(B, T, H, D).transpose(1, 2)
        p = ((q @ k.transpose(-1, -2)) / math.sqrt(D)).masked_fill(~seen, float("-inf")).softmax(-1)
        x = x + (p @ v).transpose(1, 2).reshape(B, T, H * D) @ a.c_proj.weight.T
        x = x + F.relu(rms(x) @ block.mlp.c_fc.weight.T).square() @ block.mlp.c_proj.weight.T
    return 15 * torch.tanh(rms(x) @ model.lm_head.weight.T / 15)


def test_the_baseline_trunk_equals_its_written_out_formula():
    model = build(tiny("baseline", window_pattern="L", block_size=64))
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # logits past the soft-cap's knee
    idx = batch(model.config, T=64)
    logits, _ = model(idx)
    assert logits.abs().max() > 10
    torch.testing.assert_close(logits, reference_logits(model, idx).float(), rtol=1e-5, atol=1e-5)


def test_sliding_windows_see_the_last_window_tokens():
    """SSSL at context 256: layers 0-2 and 4 see the 128 positions up to the query, 3 and 5 all of them. At 129
    tokens only the last query loses a key (key 0), at 200 the window cuts for most of them."""
    model = build(tiny("baseline"))
    for T in (129, 200):
        idx = batch(model.config, B=1, T=T)
        expected = reference_logits(model, idx, [128, 128, 128, 256, 128, 256])
        assert (expected - reference_logits(model, idx)).abs().max() > 1e-3  # the windows matter
        torch.testing.assert_close(model(idx)[0], expected.float(), rtol=1e-5, atol=1e-5)


def test_initial_weights_follow_the_documented_distributions():
    """GPT.init_weights' docstring, at d = 192 (enough entries for the moments to be within a few per cent)."""
    model = seeded(0, "value_embed_gated", n_embd=192, n_head=6, vocab_size=4096)
    d = 192
    s = math.sqrt(3 / d)
    assert abs(model.wte.weight.std().item() - 1) < 0.01
    assert abs(model.lm_head.weight.std().item() - 1e-3) < 1e-5
    for block in model.blocks:
        assert not block.attn.c_proj.weight.any() and not block.mlp.c_proj.weight.any()
        for w in (block.attn.c_q.weight, block.attn.c_k.weight, block.attn.c_v.weight, block.mlp.c_fc.weight):
            assert w.abs().max() <= s and abs(w.std().item() * math.sqrt(d) - 1) < 0.03
        if block.attn.target:
            gate = block.attn.ve_gate.weight
            assert gate.min() >= 0 and gate.max() <= 0.02 and gate.std() > 0
    for table in model.tables:  # the gated variant's tables are uniform, not RMSNorm(wte) W_V
        assert table.weight.abs().max() <= s and abs(table.weight.std().item() * math.sqrt(d) - 1) < 0.01


# ---------------------------------------------------------------------------- decoding

@pytest.mark.parametrize("variant", at_tiny())
def test_greedy_generate_with_cache_equals_without(variant):
    """Greedy decoding with the cache picks, at every step, the argmax of a full forward over the prefix.
    By causality that is the full forward over the whole output, position by position: one forward
    checks all 130 steps (the literal use_cache=False loop is run too, for two variants)."""
    cfg = tiny(variant)
    model = build(cfg)
    prompt = batch(cfg, B=2, T=20)
    n = 130  # crosses the 128-token windows of the S layers
    with_cache = model.generate(prompt, n, temperature=0, use_cache=True)
    assert with_cache.shape == (2, 150) and torch.equal(with_cache[:, :20], prompt)
    logits, _ = model(with_cache[:, :-1])
    assert torch.equal(logits[:, 19:].argmax(-1), with_cache[:, 20:])
    if variant in ("baseline", "bov"):
        assert torch.equal(with_cache, model.generate(prompt, n, temperature=0, use_cache=False))


def test_a_v_free_source_without_a_decode_branch_is_refused():
    """A V-free layer reads its values over the window in cached_keys_values; a new source there without its branch
    is refused, not read as layer 0's V (the branch before it)."""
    model = build(tiny("t1_r06"))
    model.blocks[5].attn.source = "new_source"
    cache = model.new_cache(1, 8)
    with pytest.raises(NotImplementedError, match="no decode branch in Attention.cached_keys_values for value_source 'new_source'"):
        model(batch(model.config, B=1, T=4), cache=cache)


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("variant", ["bov", "bov_shared_table", "bov_every_layer"])
def test_table_decode_steps_equal_the_full_forward(variant, offload, monkeypatch):
    """Every one-token step of a table layer goes through the embedding_bag step (never gather + SDPA)
    and gives, step by step past the 128-token windows, the logits of one full forward."""
    import model
    cfg = tiny(variant)
    m = build(cfg)
    if offload:
        m.offload_tables("cpu")
    calls = {"bag": 0, "gather": 0}
    bag, gather = model.Attention.table_decode_step, model.Attention.cached_keys_values
    def counted(name, f):
        def g(self, *a):
            calls[name] += self.table_idx is not None
            return f(self, *a)
        return g
    monkeypatch.setattr(model.Attention, "table_decode_step", counted("bag", bag))
    monkeypatch.setattr(model.Attention, "cached_keys_values", counted("gather", gather))
    idx = batch(cfg, B=2, T=150)
    cache = m.new_cache(2)
    parts = [m(idx[:, :5], cache=cache)[0]] + [m(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 150)]
    n_tables = len(cfg.table_layers())
    assert calls == {"bag": 145 * n_tables, "gather": n_tables}  # 145 one-token steps; the prefill gathers
    full, _ = m(idx)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-6, atol=1e-6)


def test_decode_without_grad_takes_the_forward_only_bag_kernel():
    """Under no_grad the table step passes a detached table, so embedding_bag skips the bookkeeping of its
    backward-ready kernel (which it picks for any weight that requires grad, grad mode or not)."""
    from torch.profiler import profile
    m = build(tiny("bov"))
    idx = batch(m.config, B=1, T=8)
    for grad, kernel in ((False, "aten::_embedding_bag_forward_only"), (True, "aten::_embedding_bag")):
        cache = m.new_cache(1)
        with torch.set_grad_enabled(grad):
            m(idx[:, :7], cache=cache)
            with profile() as prof:
                m(idx[:, 7:], cache=cache)
        names = [e.name for e in prof.events() if e.name.startswith("aten::_embedding_bag")]
        assert names and set(names) == {kernel}, names


def test_compiled_generation_compiles_a_few_graphs():
    """sample.py --compile compiles with dynamic shapes; a run must compile a few graphs, not one per
    step or per sample. Past a sliding window the table step's window start changes every step: it
    must stay symbolic (not a guarded Python value), or every step compiles a new graph until dynamo
    gives up on the frame (17 graphs before). With offloaded tables (rows fetched eagerly, one graph
    break per step; 11 graphs when dynamo traced the fetch), a second sample of the same prompt
    compiled one more graph when the row cache had one row per distinct prompt token (its size tied
    to the prompt length; now a power of two from 64) or when each step fed a view into the sequence
    (its offset tied to another size; now the new token itself). Offloaded tables run every path the
    plain model does, plus the fetch. Dynamo only (backend="eager")."""
    from torch._dynamo.utils import counters
    m, reference = (build(tiny("bov", vocab_size=200)) for _ in range(2))  # the same weights; m's row cache starts empty
    m.offload_tables("cpu")
    g = torch.Generator().manual_seed(0)
    distinct = torch.randperm(200, generator=g)[:70][None].clone()  # as many rows as prompt tokens, past 64
    long = batch(m.config, B=1, T=120)  # 50 new tokens: 42 steps past layer 4's 128-token window
    prompts = [(distinct, 6), (distinct, 6), (long, 50)]
    eager = [reference.generate(p, n, temperature=0) for p, n in prompts]
    torch._dynamo.reset()
    counters.clear()
    m.compile(backend="eager", dynamic=True)
    try:
        compiled = [m.generate(p, n, temperature=0) for p, n in prompts]
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()  # no compiled code left behind for the next tests
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
    assert graphs <= 5, f"{graphs} graphs for three sequences"


@pytest.mark.parametrize("variant", ["baseline", "bov", "t1_r06", "t1_r13"])
def test_chunked_prefill_equals_one_forward(variant):
    """Feeding 150 tokens as 2 + 98 + 1 + 49 through the cache gives the logits of one full forward (a 2-token
    prefill, what sample.py's one-token --start gives after <|bos|>, needs its causal mask too)."""
    cfg = tiny(variant)
    model = build(cfg)
    idx = batch(cfg, B=2, T=150)
    full, _ = model(idx)
    cache = model.new_cache(2)
    parts = [model(idx[:, a:b], cache=cache)[0] for a, b in ((0, 2), (2, 100), (100, 101), (101, 150))]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variant", ["baseline", "bov"])
def test_last_only_logits_are_the_last_row(variant):
    """A generation prefill computes the head for its last position only; the row equals the full forward's."""
    cfg = tiny(variant)
    model = build(cfg)
    idx = batch(cfg, B=2, T=40)
    full, _ = model(idx)
    last, loss = model(idx, last_only=True)
    assert last.shape == (2, 1, cfg.vocab_size) and loss is None
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-12, atol=1e-12)
    cache = model.new_cache(2)
    prefill, _ = model(idx, cache=cache, last_only=True)
    torch.testing.assert_close(prefill, full[:, -1:], rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="last_only=True gives no loss"):
        model(idx, idx, last_only=True)


def test_generation_past_block_size_and_sampling_seeded():
    cfg = tiny("bov", block_size=32, window_pattern="L")
    model = build(cfg)
    prompt = batch(cfg, B=1, T=10)
    assert model.generate(prompt, 3, temperature=1.0, top_k=0).shape == (1, 13)  # top_k 0: no truncation
    out = model.generate(prompt, 60, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1))
    again = model.generate(prompt, 60, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1))
    assert out.shape == (1, 70) and torch.equal(out, again)
    assert out.max() < cfg.vocab_size


def test_a_top_k_past_the_vocabulary_keeps_every_token():
    logits = torch.randn(3, 97, generator=torch.Generator().manual_seed(0))
    a = GPT.sample_next(logits, 1.0, top_k=500, generator=torch.Generator().manual_seed(1))
    b = GPT.sample_next(logits, 1.0, top_k=None, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_top_k_samples_exactly_the_k_likeliest():
    logits = torch.randn(3, 97, generator=torch.Generator().manual_seed(0))
    assert torch.equal(GPT.sample_next(logits, 1.0, top_k=1), logits.argmax(-1, keepdim=True))
    g = torch.Generator().manual_seed(0)
    seen = {int(t) for _ in range(400) for t in GPT.sample_next(logits[:1], 5.0, top_k=3, generator=g)}
    assert seen == set(torch.topk(logits[0], 3).indices.tolist())


def test_a_full_cache_restarts_from_the_last_half_block(monkeypatch):
    model = build(tiny("bov", block_size=32, window_pattern="L"))
    prefills, forward = [], GPT.forward
    def spy(self, idx, *a, cache=None, **k):
        if cache is not None and cache.pos == 0:
            prefills.append(idx.size(1))
        return forward(self, idx, *a, cache=cache, **k)
    monkeypatch.setattr(GPT, "forward", spy)
    model.generate(batch(model.config, B=1, T=10), 60, temperature=0)
    assert prefills == [10, 16, 16, 16]  # the prompt, then 16 = 32 / 2 each time the 32 positions fill


def test_the_cache_restarts_only_when_full(monkeypatch):
    """Every cache but the last is used to its last position before generation restarts from the last half block."""
    model = build(tiny("bov", block_size=32, window_pattern="L"))
    caches, new_cache = [], GPT.new_cache
    monkeypatch.setattr(GPT, "new_cache", lambda self, *a, **k: caches.append(new_cache(self, *a, **k)) or caches[-1])
    model.generate(batch(model.config, B=1, T=10), 60, temperature=0)
    # 10 + 22 positions, then 16 + 16 twice; the last: 16 + 2 (the 60th token is never fed)
    assert [c.pos for c in caches] == [32, 32, 32, 18]


def test_generation_without_cache_crops_to_the_last_block():
    """Past block_size, use_cache=False feeds the last block_size tokens: the greedy tokens of a
    loop of cropped full forwards."""
    cfg = tiny("bov", block_size=32, window_pattern="L")
    model = build(cfg)
    seq = batch(cfg, B=2, T=10)
    out = model.generate(seq, 40, temperature=0, use_cache=False)
    for _ in range(40):
        logits, _ = model(seq[:, -32:])
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


def test_generation_with_a_one_token_context():
    """When the cache is full, generation restarts it from the last half block, at least one token:
    with block_size 1 every step is a fresh one-token prefill, the same as the uncached loop."""
    model = build(tiny("bov", block_size=1, window_pattern="L"))
    seq = batch(model.config, B=2, T=1)
    out = model.generate(seq, 7, temperature=0)
    assert out.shape == (2, 8) and torch.equal(out, model.generate(seq, 7, temperature=0, use_cache=False))


@pytest.mark.parametrize("wide", [torch.float64, torch.float32])
def test_sampling_at_a_tiny_temperature_is_greedy(wide, monkeypatch):
    """Logits of size ~10 over 1e-308 overflow even float64; sampling divides after subtracting the
    maximum, so a tiny temperature gives the argmax (0 and -inf), not NaN probabilities; so too in float32,
    the widest float on MPS (widest_float), where 1e-308 is 0."""
    asked = []
    monkeypatch.setattr(model_module, "widest_float", lambda device: asked.append(device) or wide)
    logits = 10 * torch.randn(4, 97, generator=torch.Generator().manual_seed(0))
    for t in (1e-308, 1e-40, 1e-3):
        assert torch.equal(GPT.sample_next(logits, temperature=t, generator=torch.Generator().manual_seed(1)),
                           logits.argmax(-1, keepdim=True))
    assert asked == [logits.device] * 3
    for t in (-1.0, float("nan"), float("inf")):  # a negative temperature is no greedy one; inf would drop top_k
        with pytest.raises(ValueError, match=f"^temperature must be a finite number >= 0 \\(0: greedy\\), not {t}$"):
            GPT.sample_next(logits, temperature=t)
    model, prefilled = GPT(tiny("bov")), []
    monkeypatch.setattr(model, "forward", lambda *a, **k: prefilled.append(1))
    with pytest.raises(ValueError, match="^temperature must be"):  # refused before the prompt's forward
        next(model.stream(torch.zeros(1, 3, dtype=torch.long), 5, temperature=-1.0))
    assert prefilled == []


@pytest.mark.parametrize("variant", ["baseline", "bov", "svformer", "bov_keep_v", "value_embed_gated", "bov_shared_table",
                                     "t1_r09"])
def test_cache_bytes_equal_the_analytic_formula(variant):
    cfg = tiny(variant)
    for dtype in (torch.float32, torch.bfloat16):
        cache = KVCache(cfg, batch=3, max_len=100, dtype=dtype, device="cpu")
        assert cache.nbytes() == cfg.kv_cache_bytes(3, 100, dtype)
    d, L, item = cfg.n_embd, cfg.n_layer, 2
    per_token = {"baseline": 2 * L * d * item, "bov": (2 * L - 2) * d * item + 4,
                 "svformer": (2 * L - 5) * d * item, "bov_keep_v": 2 * L * d * item,  # E_v[i] is in its V: no ids
                 "value_embed_gated": 2 * L * d * item,
                 "bov_shared_table": (2 * L - 2) * d * item + 4, "t1_r09": 2 * L * d * item}[variant]
    assert cfg.kv_cache_bytes(1, 1, torch.bfloat16) == per_token


def test_eq6_breakeven_at_t_equal_vocab():
    """V-cache saved minus table bytes = (L/3) d (T - |V|) per sequence; with B sequences, (L/3) d (B T - |V|)."""
    base, bov = GPTConfig.preset("paper_135m"), GPTConfig.preset("paper_135m", "bov")
    V, d, L = 32768, 768, 12
    for B, T in ((1, V), (1, 4 * V), (8, V // 8), (4, 1000)):
        saved_v = base.kv_cache_bytes(B, T, torch.bfloat16) - (bov.kv_cache_bytes(B, T, torch.bfloat16) - 4 * B * T)
        net = saved_v - bov.table_bytes(torch.bfloat16)
        assert net == (L // 3) * d * (B * T - V) * 2
    assert bov.table_bytes(torch.float32) == 4 * V * d * 4


# ---------------------------------------------------------------------------- accounting

def test_estimate_flops_matches_the_paper_to_the_unit():
    assert GPT.meta(GPTConfig.preset("paper_135m")).estimate_flops() == 759_693_312
    assert GPT.meta(GPTConfig.preset("paper_780m")).estimate_flops() == 4_775_215_104
    assert GPT.meta(GPTConfig.preset("paper_780m", "bov")).estimate_flops() == 4_661_968_896
    # 3.91e19 FLOPs buy 8.19B tokens for the baseline and 8.39B for BoV (Section 5)
    assert round(3.91e19 / 4_775_215_104 / 1e9, 2) == 8.19
    assert round(3.91e19 / 4_661_968_896 / 1e9, 2) == 8.39


def test_parameter_counts():
    n = GPT.meta(GPTConfig.preset("paper_135m")).num_params()
    assert round(n["dense"] / 1e6, 1) == 135.3 and n["tables"] == 0
    # the matmul weights (Table 6's base): 12 d^2 a layer (W_Q, W_K, W_V, W_O and the MLP's 8 d^2), and the lm_head
    assert n["scaling"] == 12 * 12 * 768 ** 2 + 32768 * 768
    assert round(GPT.meta(GPTConfig.preset("paper_780m")).num_params()["dense"] / 1e6, 1) == 780.1
    n = GPT.meta(GPTConfig.preset("paper_135m", "bov")).num_params()
    assert n["tables"] == 4 * 32768 * 768
    assert n["dense"] == 135_266_304 - 4 * 768 * 768 + 4  # four W_V gone, four gamma_v added
    assert n["scaling"] == (12 * 12 - 4) * 768 ** 2 + 32768 * 768  # neither the gamma_v nor the tables
    assert round(n["dense"] / 1e6, 1) == 132.9 and round(n["tables"] / 1e6, 1) == 100.7
    meta = GPT.meta(GPTConfig.preset("paper_780m", "bov"))
    assert all(p.device.type == "meta" for p in meta.parameters())
    n = meta.num_params()  # eight W_V of 1536 x 1536 gone, eight gamma_v added, eight tables of 32768 x 1536
    assert n["dense"] == 780_140_544 - 8 * 1536 * 1536 + 8 and n["tables"] == 8 * 32768 * 1536
    assert (round(n["dense"] / 1e6, 1), round(n["tables"] / 1e6, 1)) == (761.3, 402.7)


@pytest.mark.parametrize("variant", at_tiny())
def test_estimate_flops_against_the_flop_counter(variant):
    """Every variant, as a new mechanism's FLOPs are easy to miss: a matrix applied twice counts once in
    estimate_flops, and a W_V left in a layer that never applies it (a V-free source not in v_free_layers())
    counts in the estimate and not here."""
    cfg = tiny(variant, window_pattern="L", block_size=64)
    model = GPT(cfg)
    idx = batch(cfg, B=2, T=64)
    with FlopCounterMode(display=False, custom_mapping=SDPA_FLOPS) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    counts = counter.get_flop_counts()["Global"]
    assert counts[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] > 0
    # every matmul weight costs 6 FLOPs per token: forward, grad of input, grad of weight
    weights = model.estimate_flops() - 12 * cfg.n_embd * cfg.block_size * cfg.n_layer
    assert counts[torch.ops.aten.mm] == weights * idx.numel()
    measured = counter.get_total_flops() / idx.numel()
    assert abs(measured - model.estimate_flops()) / model.estimate_flops() < 0.02


def test_the_cuda_attention_backward_is_counted_as_the_cpu_one():
    """torch counts its CUDA SDPA backward kernels as 5 matmuls (2.5 x forward); bench counts them as the CPU's
    and as estimate_flops does, 2 x forward, so that a GPU's measured FLOPs match the estimate as the CPU's do."""
    q = k = v = grad = torch.empty(2, 3, 16, 8, device="meta")
    registry = FlopCounterMode(display=False, custom_mapping=SDPA_FLOPS).flop_registry
    forward = 4 * 2 * 3 * 16 * 16 * 8  # q K^T and P V: 2 x (2 T^2 D) per head
    assert registry[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu](q, k, v) == forward
    for op in (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward,
               torch.ops.aten._scaled_dot_product_efficient_attention_backward,
               torch.ops.aten._scaled_dot_product_flash_attention_backward,
               torch.ops.aten._scaled_dot_product_cudnn_attention_backward):
        assert registry[op](grad, q, k, v, None, None) == 2 * forward, op


def test_gradients_reach_only_the_rows_of_tokens_in_the_batch():
    cfg = tiny("bov")
    torch.manual_seed(0)
    model = GPT(cfg)
    _same_nonzero_projections(model)
    idx = torch.randint(0, 40, (2, 30))  # ids 40.. never appear
    _, loss = model(idx, idx)
    loss.backward()
    present = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    present[idx.unique()] = True
    for table in model.tables:
        row_has_grad = table.weight.grad.abs().sum(dim=1) > 0
        assert torch.equal(row_has_grad, present)


def test_per_token_losses_and_ignore_index():
    cfg = tiny("bov")
    model = build(cfg)
    idx = batch(cfg, T=16)
    targets = idx.clone()
    targets[:, :5] = -1
    _, per_token = model(idx, targets, reduction="none")
    _, mean = model(idx, targets)
    assert per_token.shape == (2, 16)
    assert torch.all(per_token[:, :5] == 0)
    torch.testing.assert_close(per_token.sum() / 22, mean)


def test_coefficient_values_at_init():
    model = GPT(tiny("t1_r13"))
    assert model.coefficient_values() == {4: {"alpha_v": 1.0, "beta_v": 0.0}, 5: {"alpha_v": 1.0, "beta_v": 0.0}}
    assert GPT(tiny("bov")).coefficient_values() == {4: {"gamma_v": 1.0}, 5: {"gamma_v": 1.0}}


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("bad_ids, message", [
    (torch.tensor([[1, 2, -1]]), "token ids must be in"),
    (torch.tensor([[1, 2, 97]]), "token ids must be in"),
    (torch.tensor([[1, 2, -1]], dtype=torch.int32), "got min -1 max 2$"),
    (torch.tensor([[1, 2**31 - 1]], dtype=torch.int32), "got min 1 max 2147483647$"),
    (torch.zeros(1, 257, dtype=torch.long), "longer than block_size"),
    (torch.zeros(3, dtype=torch.long), "(batch, time)"),
    (torch.zeros(1, 3), "int64"),
])
def test_bad_ids_raise_value_error(bad_ids, message):
    model = GPT(tiny("bov"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model(bad_ids)


def test_generate_checks_the_prompt_before_anything_runs():
    """A prompt longer than block_size is refused with or without the cache (never cropped, nor blamed on the
    cache), and bad ids are refused even when no token is asked for."""
    model = GPT(tiny("bov"))
    for use_cache in (True, False):
        with pytest.raises(ValueError, match="^sequence of 257 tokens is longer than block_size 256$"):
            model.generate(torch.zeros(1, 257, dtype=torch.long), 1, use_cache=use_cache)
    with pytest.raises(ValueError, match="token ids must be in"):
        model.generate(torch.tensor([[1, 97]]), 0)


def test_top_k_of_the_whole_vocabulary_excludes_no_token(monkeypatch):
    """top_k >= |V| (sample.py's default 200 over a smaller vocabulary) keeps every token drawable."""
    seen = []
    monkeypatch.setattr(torch, "multinomial", lambda probs, n, generator=None: seen.append(probs) or probs.argmax(-1, keepdim=True))
    logits = -torch.arange(97.0).unsqueeze(0)  # token 96 the least likely
    for top_k in (97, 200):
        GPT.sample_next(logits, 1.0, top_k)
    assert all(bool((p > 0).all()) for p in seen)
    GPT.sample_next(logits, 1.0, 96)
    assert seen[-1][0, -1] == 0 and bool((seen[-1][0, :-1] > 0).all())


def test_table_decode_scores_and_softmax_are_float32_under_bf16(monkeypatch):
    """Under bf16 autocast q and the cached keys are bf16; the decode step's scores q K^T and its attention
    weights are still computed in float32, as SDPA computes them inside its kernel (a bf16 product rounds them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class ScoreDtypes(TorchDispatchMode):  # below autocast: sees the product in the dtype it runs in
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.bmm.default:  # only the table layers' q K^T: other layers call SDPA
                scores.append(out.dtype)
            return out
    model = GPT(tiny("bov")).eval()
    dtypes, scores, softmax = [], [], torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda *a, **k: dtypes.append(k.get("dtype")) or softmax(*a, **k))
    with torch.autocast("cpu", dtype=torch.bfloat16), ScoreDtypes():
        model.generate(batch(model.config, B=1, T=5), 2, temperature=0)
    assert dtypes and set(dtypes) == {torch.float32}
    assert scores and set(scores) == {torch.float32}
    dtypes.clear(), scores.clear()
    with ScoreDtypes():  # a model cast to bf16, without autocast: its keys are bf16 too
        model.to(torch.bfloat16).generate(batch(model.config, B=1, T=5), 2, temperature=0)
    assert dtypes and set(dtypes) == {torch.float32}
    assert scores and set(scores) == {torch.float32}


@pytest.mark.parametrize("variant", ["baseline", "bov"])
def test_a_float64_model_decodes_under_autocast_as_without(variant):
    """Autocast leaves float64 alone, so a float64 model's q, K and V stay float64 under a bf16 autocast: its cache
    must be float64 too (a bf16 cache rounded K and V and SDPA refused the mixed dtypes), and the cached decode gives
    the tokens of the uncached one."""
    model, prompt = build(tiny(variant)), batch(tiny(variant), B=1, T=5)
    expected = model.generate(prompt, 6, temperature=0, use_cache=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.new_cache(1).k[0].dtype == torch.float64
        assert torch.equal(model.generate(prompt, 6, temperature=0), expected)


def test_cache_overflow_raises():
    model = GPT(tiny())
    cache = model.new_cache(1, max_len=10)
    model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="positions left in the KV cache"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="holds 1 to block_size = 256 positions, not 512"):
        model.new_cache(1, max_len=512)  # RoPE and training cover block_size positions


@pytest.mark.parametrize("kwargs, message", [
    (dict(size="paper_1b"), "unknown size"),
    (dict(variant="bov2"), "unknown variant"),
    (dict(n_layers=3), "unknown GPTConfig field"),
    (dict(variant="t1_r06", bov_layers=(0, 5)), "layer 0 produces V1"),
    (dict(bov_layers=(1, 6)), "layer indices in"),
    (dict(bov_layers="last_half"), "bov_layers must be"),
    (dict(n_embd=50), "not divisible"),
    (dict(window_pattern="SSXL"), "window_pattern"),
    (dict(variant="bov", value_mix="mix"), "value_mix must be 'replace' or 'add', got 'mix'"),
    (dict(variant="bov", value_coeff="head"), "value_coeff must be 'learned', 'fixed' or 'gated', got 'head'"),
    (dict(variant="bov", value_coeff="gated"), "gated"),
    (dict(variant="t1_r09", shared_table=True), "shared_table"),
    (dict(bov_layers=True), "layer indices in"),  # a bool is no layer index
    (dict(variant="bov", bov_layers=(True, 5)), "layer indices in"),  # nor inside a list (True was layer 1)
    (dict(variant="bov", bov_layers=(-1,)), "layer indices in"),
    (dict(n_layer=0), "n_layer must be a positive integer"),
    (dict(n_layer=True), "n_layer must be a positive integer, got True"),
    (dict(n_embd=12, n_head=4), "head_dim=3 must be even for RoPE"),
    (dict(window_pattern=""), "window_pattern must be a non-empty string"),
    (dict(variant="t1_r02", value_mix="add"), "is V \\+ V"),
    (dict(variant="t1_r02", value_coeff="fixed"), "is standard attention"),
    (dict(variant="value_embed_gated", value_source="x0"), "it needs value_source 'table'"),
    (dict(variant="value_embed_gated", n_embd=8, n_head=2), "n_embd must be at least 12"),
])
def test_bad_configs_raise_value_error(kwargs, message):
    kw = dict(kwargs)
    size, variant = kw.pop("size", "cpu"), kw.pop("variant", "baseline")
    with pytest.raises(ValueError, match=message):
        GPTConfig.preset(size, variant, **kw)


def test_shapes_past_their_bounds_are_refused():
    """Past these, torch failed in a traceback (10**23 layers: an OverflowError in range; n_embd 2^32: 'Storage size
    calculation overflowed'; block_size 10**20: in the rotary tables) instead of one line; each bound is allowed."""
    at = dict(vocab_size=2**31 - 1, n_layer=1024, n_embd=2**20, block_size=2**24)  # n_head: at most n_embd / 2 (RoPE)
    assert set(at) == set(model_module.LIMITS)
    for name, value in at.items():
        shape = dict(n_embd=value, n_head=value // 2) if name == "n_embd" else {name: value}
        GPTConfig.preset("cpu", "bov", **shape)
        with pytest.raises(ValueError, match=rf"^bad GPTConfig: {name} must be at most {value:,} \(.+\), got {value + 1:,}"):
            GPTConfig.preset("cpu", "bov", **{**shape, name: value + 1})
    with pytest.raises(ValueError, match=r"n_layer must be at most 1,024 .*got 99,999,999,999,999,999,999,999"):
        GPTConfig.preset("cpu", "bov", n_layer=10**23 - 1)


# ---------------------------------------------------------------------------- host-offloaded tables

def test_the_row_cache_starts_over_for_every_sequence():
    """Each distinct token's rows cross once per sequence (generate), not once per model."""
    model = build(tiny("bov"))
    model.offload_tables("cpu")
    prompt = batch(model.config, B=1, T=10)
    model.generate(prompt, 20, temperature=0)
    first = model.offload.rows_fetched
    model.generate(prompt, 20, temperature=0)
    assert first > 0 and model.offload.rows_fetched == 2 * first


def test_the_row_cache_fetches_each_id_once_and_stays_small():
    """The row of slot 0 is not fetched again; the cache starts at 64 rows and never grows past |V|; the
    tables' parameters are views of the one host copy."""
    model = build(tiny("bov"))
    model.offload_tables("cpu")
    off, n = model.offload, len(model.tables)
    assert all(t.weight.untyped_storage().data_ptr() == off.host.untyped_storage().data_ptr() for t in model.tables)
    off.prefetch(torch.tensor([[3, 4]]))
    assert off.device_rows.size(1) == 64 and off.rows_fetched == 2 * n
    off.prefetch(torch.tensor([[3]]))  # slot 0's id again
    off.prefetch(torch.tensor([[4, 3]]))
    assert off.used == 2 and off.rows_fetched == 2 * n and off.bytes_moved == 2 * n * 48 * 8
    off.prefetch(torch.arange(97).view(1, -1))  # every id: 97 rows, not the next power of two (128)
    assert off.device_rows.size(1) == 97 and off.used == 97 and off.rows_fetched == 97 * n
    torch.testing.assert_close(off.rows(1, torch.tensor([5, 3])), model.tables[1].weight[[5, 3]], rtol=0, atol=0)
    model = build(tiny("bov", vocab_size=300))  # powers of two from 64 rows: 64 ids fill 64 rows, 65 take 128
    model.offload_tables("cpu")
    for ids, rows in ((64, 64), (65, 128), (129, 256), (300, 300)):
        model.offload.prefetch(torch.arange(ids).view(1, -1))
        assert model.offload.device_rows.size(1) == rows and model.offload.used == ids
    for seed in range(3):  # started over per sequence: it holds the ids this sequence fed, however many came before
        out = model.generate(batch(model.config, B=1, T=40, seed=seed), 5, temperature=0)
        assert model.offload.used == len(set(out[0, :-1].tolist()))


def test_streams_taking_turns_on_offloaded_tables_are_each_their_own():
    """Two GPT.stream()s of one model with offloaded tables, stepped in turn: each yields the tokens it yields alone.
    The second stream's reset() forgets the first's rows; the first's next step fetches them again (before, its bag
    index read slot -1). Past block_size too, where a stream restarts its cache."""
    model = build(tiny("bov", block_size=32))
    a, b = batch(model.config, B=1, T=5, seed=1), batch(model.config, B=2, T=9, seed=2)
    alone = [model.generate(p, 40, temperature=0) for p in (a, b)]
    model.offload_tables("cpu")
    streams, outs = [model.stream(p, 40, temperature=0) for p in (a, b)], [[a], [b]]
    for _ in range(40):
        for s, out in zip(streams, outs):
            out.append(next(s))
    for out, ref in zip(outs, alone):
        assert torch.equal(torch.cat(out, dim=1), ref)
    assert model.offload.epoch == 3  # __init__'s reset and each stream's


def test_a_fetch_that_failed_is_made_again_at_the_next_pass(monkeypatch):
    """A cache whose rows went stale (another stream's reset) keeps asking for them until a fetch has brought them: a
    fetch interrupted midway (a Ctrl-C in a notebook, out of memory) left it marked as fetched, and its next step read
    slot -1 (before: an index error)."""
    model = build(tiny("bov"))
    prompt = batch(model.config, B=1, T=5)
    expected = model(torch.cat([prompt, prompt[:, :1]], dim=1))[0][:, -1]
    model.offload_tables("cpu")
    cache = model.new_cache(1)
    model(prompt, cache=cache)
    model.offload.reset()  # another stream started
    real, calls = torch.index_select, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(torch, "index_select", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model(prompt[:, :1], cache=cache)
    cache.pos = 5  # the interrupted step wrote nothing that counts
    logits, _ = model(prompt[:, :1], cache=cache)
    torch.testing.assert_close(logits[:, -1], expected, rtol=0, atol=1e-12)


def test_the_widest_float_is_float64_but_on_mps():
    assert [widest_float(d) for d in ("cpu", "cuda:1", torch.device("meta"), "mps")] == [torch.float64] * 3 + [torch.float32]


def test_offloading_moves_everything_but_the_tables():
    """offload_tables(device) moves every parameter and buffer but the value tables, the rotary tables included (the
    meta device stands in for a GPU here: no data moves); the tables and their host copy stay in host memory."""
    model = GPT(tiny("bov"))
    model.offload_tables("meta")
    where = {n: t.device.type for n, t in [*model.named_parameters(), *model.named_buffers()]}
    assert {"cos", "sin", "tables.0.weight"} <= set(where)
    assert where == {n: "cpu" if n.startswith("tables.") else "meta" for n in where}
    off = model.offload
    assert (off.host.device.type, off.device_rows.device.type, off.slot.device.type) == ("cpu", "meta", "meta")

    class OnTheGPU:  # a table parameter of a model built or loaded on the device, as TableOffload reads it
        def __init__(self, t):
            self.t = t

        def detach(self):
            return self

        def cpu(self):
            return self.t.clone()
    host = TableOffload([OnTheGPU(torch.ones(8, 4)), OnTheGPU(torch.zeros(8, 4))], "meta").host  # on CUDA: then pinned
    assert host.device.type == "cpu" and host.shape == (2, 8, 4) and host[0].eq(1).all() and host[1].eq(0).all()


def test_offloaded_rows_are_read_from_the_device_row_cache():
    """Once prefetched, a row is read from the device row cache, never from the host tables again (the host copy is
    zeroed here after the prefetch: the rows keep the values they crossed with)."""
    model = build(tiny("bov"))
    expected = [t.weight[[5, 3, 5]].clone() for t in model.tables]
    model.offload_tables("cpu")
    model.offload.prefetch(torch.tensor([[3, 5]]))
    model.offload.host.zero_()
    for t in range(len(model.tables)):
        torch.testing.assert_close(model.offload.rows(t, torch.tensor([5, 3, 5])), expected[t], rtol=0, atol=0)


def test_a_model_with_offloaded_tables_is_not_converted_after():
    """model.to(dtype) after offload_tables() would copy the table parameters apart from the host copy that decoding
    reads (the decode then reads the old tables), and .to(device) would move the tables after all: refused."""
    model = build(tiny("bov"))
    model.offload_tables("cpu")
    for convert in (lambda m: m.to(torch.bfloat16), lambda m: m.float(), lambda m: m.to("cpu")):
        with pytest.raises(RuntimeError, match=r"^the value tables are offloaded: convert or move the model before "
                                               r"offload_tables\(\), not after$"):
            convert(model)
    assert all(t.weight.dtype == torch.float64 and t.weight.untyped_storage().data_ptr() ==
               model.offload.host.untyped_storage().data_ptr() for t in model.tables)
    assert build(tiny("bov")).float().offload_tables("cpu").offload.host.dtype == torch.float32  # before: fine


@pytest.mark.parametrize("variant", ["bov", "bov_shared_table", "value_embed_gated"])
def test_offloaded_tables_give_the_same_tokens(variant):
    cfg = tiny(variant)
    model = build(cfg)
    prompt = batch(cfg, B=2, T=30)
    expected = model.generate(prompt, 150, temperature=0)
    model.offload_tables("cpu")
    got = model.generate(prompt, 150, temperature=0)
    assert torch.equal(got, expected)
    # every distinct id that went through the model crossed once, for every table (the last token is never fed)
    n_tables = len(model.tables)
    assert model.offload.rows_fetched == got[:, :-1].unique().numel() * n_tables
    assert model.offload.bytes_moved == model.offload.rows_fetched * cfg.n_embd * 8  # float64


# ---------------------------------------------------------------------------- optimisers and checkpoints

def test_a_parameter_in_no_optimizer_group_is_named():
    """A new parameter outside the blocks (a second embedding, say) would not be trained: configure_optimizers
    refuses, naming it and where to add its group."""
    model = GPT(tiny("bov"))
    model.wte2 = torch.nn.Embedding(3, 4)
    with pytest.raises(AssertionError, match=r"exactly one optimizer group; not so: wte2\.weight \(add a new parameter's group"):
        model.configure_optimizers()


def test_optimizer_groups_are_total_with_the_papers_rates():
    model = GPT(GPTConfig.preset("paper_135m", "t1_r13", n_layer=3, bov_layers=(2,)))
    muon, adamw = model.configure_optimizers()
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    lrs = {g["name"]: g["lr"] for g in adamw.param_groups}
    assert lrs == {"embedding": 0.30, "lm_head": 0.008, "scalars": 0.50}
    assert muon.param_groups[0]["lr"] == 0.02 and muon.param_groups[0]["weight_decay"] == 0.28
    assert muon.param_groups[0]["nesterov"] and muon.param_groups[0]["momentum"] == 0.95
    assert all(g["weight_decay"] == 0.0 and g["betas"] == (0.8, 0.95) and g["eps"] == 1e-10 for g in adamw.param_groups)
    scalars = {id(p) for g in adamw.param_groups if g["name"] == "scalars" for p in g["params"]}
    assert scalars == {id(model.blocks[2].attn.alpha_v), id(model.blocks[2].attn.beta_v)}
    # tables at d=192: AdamW rates x (192/768)^-0.5 = 2
    muon, adamw = GPT(tiny("bov", n_embd=192, n_head=6)).configure_optimizers()
    lrs = {g["name"]: g["lr"] for g in adamw.param_groups}
    assert lrs == {"embedding": 0.60, "lm_head": 0.016, "tables": 0.30, "scalars": 0.50}


def test_every_block_matrix_is_trained_by_muon():
    """The gate's W_g is a 2-D block matrix too (nanochat trains it with Muon), not a scalar."""
    model = GPT(tiny("value_embed_gated"))
    muon, _ = model.configure_optimizers()
    assert {id(p) for p in muon.param_groups[0]["params"]} == {id(p) for p in model.blocks.parameters() if p.dim() == 2}
    assert any(p is model.blocks[5].attn.ve_gate.weight for p in muon.param_groups[0]["params"])


def test_checkpoint_round_trip(tmp_path, monkeypatch):
    model = build(tiny("bov"))
    path = tmp_path / "ckpt.pt"
    model.save_checkpoint(str(path), step=7)
    loaded, ckpt = GPT.from_checkpoint(str(path))
    assert ckpt["step"] == 7 and loaded.config == model.config and not loaded.training
    idx = batch(model.config)
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        GPT.from_checkpoint(str(tmp_path / "missing.pt"))
    assert torch.equal(GPT.from_checkpoint(str(tmp_path))[0](idx)[0], model(idx)[0])  # the run's folder: its ckpt.pt
    (tmp_path / "out" / "cpu_x").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'out'} is a folder with no checkpoint \\(ckpt.pt\\) in or below it; "):
        GPT.from_checkpoint(str(tmp_path / "out"))
    os.replace(path, tmp_path / "out" / "cpu_x" / "ckpt.pt")
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path} is a folder without ckpt.pt; checkpoints below it: "
                                                f"{tmp_path / 'out' / 'cpu_x' / 'ckpt.pt'}$"):
        GPT.from_checkpoint(str(tmp_path))
    # the search is bounded and never loops: symlinks back up the tree, a checkpoint 4 folders down, many folders
    os.symlink(tmp_path, tmp_path / "out" / "up")
    os.symlink(tmp_path / "out", tmp_path / "out" / "cpu_x" / "self")
    assert model_module.checkpoints_below(str(tmp_path)) == ([str(tmp_path / "out" / "cpu_x" / "ckpt.pt")], True)
    deep = tmp_path / "d" / "1" / "2" / "3"
    deep.mkdir(parents=True)
    (deep / "ckpt.pt").write_bytes(b"")
    assert model_module.checkpoints_below(str(tmp_path / "d"), depth=3) == ([str(deep / "ckpt.pt")], True)
    assert model_module.checkpoints_below(str(tmp_path / "d"), depth=2) == ([], False)
    for i in range(5):
        (tmp_path / "many" / str(i)).mkdir(parents=True)
    assert model_module.checkpoints_below(str(tmp_path / "many"), folders=6) == ([], True)
    assert model_module.checkpoints_below(str(tmp_path / "many"), folders=5) == ([], False)
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'd'} is a folder with no checkpoint \\(ckpt.pt\\) in it or in "
                                                f"the first folders below it \\(a bounded search\\); `python train.py` writes one$"):
        monkeypatch.setattr(model_module, "checkpoints_below", lambda f: ([], False))
        GPT.from_checkpoint(str(tmp_path / "d"))
    missing = tmp_path / "out" / "cpu_baseline" / "ckpt.pt"  # train.py's own out_dir: the command that writes it
    with pytest.raises(FileNotFoundError, match=f"^no checkpoint at {missing}; `python train.py --size=cpu --variant=baseline` "
                                                f"writes one$"):
        GPT.from_checkpoint(str(missing))
    os.replace(tmp_path / "out" / "cpu_x" / "ckpt.pt", path)
    good = path.read_bytes()
    path.write_bytes(good[:1000])
    whole_zip = f"^cannot read checkpoint {path}: not a checkpoint train.py wrote, or damaged \\(not a complete zip archive\\)$"
    with pytest.raises(ValueError, match=whole_zip):  # cut short: its zip directory is gone
        GPT.from_checkpoint(str(path))
    path.write_bytes(b"\x7fELF" + bytes(range(256)) * 4)  # not a torch file at all
    with pytest.raises(ValueError, match=whole_zip):
        GPT.from_checkpoint(str(path))
    zipfile.ZipFile(path, "w").close()  # a whole zip, but not torch.save's
    with pytest.raises(ValueError, match=f"^cannot read checkpoint {path}: not a checkpoint train.py wrote, or damaged "
                                         r"\(a zip archive, but not torch.save's: no data.pkl\)$"):
        GPT.from_checkpoint(str(path))
    path.write_bytes(good)
    record = flip_tensor_byte(path)  # torch.load would take it, one weight changed
    assert torch.load(str(path), weights_only=True)["model"].keys() == torch.load(io.BytesIO(good), weights_only=True)["model"].keys()
    with pytest.raises(ValueError, match=f"^cannot read checkpoint {path}: not a checkpoint train.py wrote, or damaged "
                                         f"\\(its record {record} fails the zip's CRC-32 or header check\\)$"):
        GPT.from_checkpoint(str(path))
    damaged = f"^cannot read checkpoint {path}: not a checkpoint train.py wrote, or damaged \\(.+\\)$"
    for method in (8, 12, 14, 99):  # a header's bits changed: deflate, bzip2, lzma (each fails), or an unknown method
        path.write_bytes(good)
        set_compression_method(path, method)
        with pytest.raises(ValueError, match=damaged):
            GPT.from_checkpoint(str(path))
    name = max(zipfile.ZipFile(io.BytesIO(good)).infolist(), key=lambda r: r.file_size).filename.encode()
    for where in (good.find(name), good.rfind(name)):  # a record's name, not UTF-8: in its local header, in the directory
        flipped = bytearray(good)
        flipped[where] ^= 0x80
        path.write_bytes(bytes(flipped))
        with pytest.raises(ValueError, match=damaged):
            GPT.from_checkpoint(str(path))
    zip64_end = good.rfind(b"PK\x06\x06")  # torch.save writes a zip64 end record: its directory offset's top byte
    assert zip64_end > 0
    flipped = bytearray(good)
    flipped[zip64_end + 55] = 0xFF  # every record's offset then below -2**63: a ValueError at the seek
    path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=damaged):
        GPT.from_checkpoint(str(path))
    path.write_bytes(good)
    for raised, message in ((OSError(errno.EINVAL, "Invalid argument"), "not a checkpoint train.py wrote, or damaged "
                             "(OSError: [Errno 22] Invalid argument)"),  # a directory offset past the start: a bad seek
                            (OSError(errno.EIO, "Input/output error"), "Input/output error")):  # the disk's own error
        with monkeypatch.context() as m:
            m.setattr(zipfile.ZipFile, "testzip", lambda self: (_ for _ in ()).throw(raised))
            assert unreadable_checkpoint(str(path)) == f"cannot read checkpoint {path}: {message}"
    class FailingDisk(io.FileIO):  # a disk that reads the first bytes, then fails: at the zip's end record
        def read(self, size=-1):
            if self.tell() + size != 14:
                raise OSError(errno.EIO, "Input/output error")
            return super().read(size)
    with monkeypatch.context() as m:
        m.setattr(model_module, "open", FailingDisk, raising=False)
        assert unreadable_checkpoint(str(path)) == f"cannot read checkpoint {path}: Input/output error"
    with monkeypatch.context() as m, pytest.raises(MemoryError):  # not taken for damage: raised as it is
        m.setattr(zipfile.ZipFile, "testzip", lambda self: (_ for _ in ()).throw(MemoryError()))
        unreadable_checkpoint(str(path))
    with serialization_config.patch({"save.compute_crc32": False}):  # a writer that skips CRC-32s writes 0s: nothing to check
        torch.save(torch.load(io.BytesIO(good), weights_only=True), str(path))
    assert not any(r.CRC for r in zipfile.ZipFile(path).infolist())
    assert torch.equal(GPT.from_checkpoint(str(path))[0](idx)[0], model(idx)[0])
    torch.save({"model": 1}, str(path))  # torch.save's, but not train.py's
    with pytest.raises(ValueError, match=f"^cannot read checkpoint {path}: KeyError: 'model_config'$"):
        GPT.from_checkpoint(str(path))
    for protocol in (2, 3):  # torch's legacy format (a pickle) still loads, at its default protocol and another
        torch.save(torch.load(io.BytesIO(good), weights_only=True), str(path), _use_new_zipfile_serialization=False,
                   pickle_protocol=protocol)
        assert (protocol != 2) == (path.read_bytes()[:14] != TORCH_LEGACY_MAGIC)
        with warnings.catch_warnings():  # torch warns of a protocol other than its default, and loads it
            warnings.simplefilter("ignore", UserWarning)
            GPT.from_checkpoint(str(path))
    path.write_bytes(good)
    ckpt = torch.load(io.BytesIO(good), weights_only=True)
    ckpt["model"]["wte.weight"] = ckpt["model"]["wte.weight"][:10]
    torch.save(ckpt, str(path))
    with pytest.raises(ValueError, match="size mismatch for wte.weight") as e:  # says which entry does not fit
        GPT.from_checkpoint(str(path))
    assert "\n" not in str(e.value)


def test_a_checkpoint_keeps_its_layer_list_and_never_unpickles_objects(tmp_path):
    """bov_layers, a tuple, comes back as one from the checkpoint's dict, with its one shared table; an entry that is a
    Python object, not tensors and plain values, is refused by the weights-only load, never run."""
    model = build(tiny("bov_shared_table", bov_layers=(3, 5)))
    path = str(tmp_path / "ckpt.pt")
    model.save_checkpoint(path)
    loaded, _ = GPT.from_checkpoint(path)
    assert loaded.config == model.config and loaded.config.bov_layers == (3, 5) and len(loaded.tables) == 1
    idx = batch(model.config)
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    model.save_checkpoint(path, args=argparse.Namespace(lr=0.1))
    with pytest.raises(ValueError, match=re.escape(f"cannot read checkpoint {path}: not a checkpoint train.py wrote, or "
                                                   "damaged (a weights-only load refused its contents)")):
        GPT.from_checkpoint(path)


def test_a_missing_checkpoint_names_a_train_py_command_only_for_its_own_out_dirs(tmp_path):
    """out/SIZE_VARIANT/ckpt.pt names the command that writes it; any other path, or an unknown size or
    variant, names plain `python train.py` (a command that would write elsewhere, or be refused, helps no one).
    A paper size's run is named with its preset file, as the README trains it (`--size=paper_135m` alone kept the
    cpu run's Shakespeare data: 1,750 epochs of it, from a README walkthrough)."""
    from model import no_checkpoint
    for run, how, variant in (("cpu_bov", "--size=cpu", "bov"), ("paper_135m_t1_r01", "config/paper_135m.py", "t1_r01"),
                              ("paper_780m_bov", "config/paper_780m.py", "bov"), ("cpu_baseline", "--size=cpu", "baseline")):
        for path in (tmp_path / "out" / run / "ckpt.pt", tmp_path / "out" / run):  # the folder names the same run
            assert no_checkpoint(str(path)) == f"no checkpoint at {path}; `python train.py {how} --variant={variant}` writes one"
    run = tmp_path / "made" / "out" / "cpu_baseline"
    run.mkdir(parents=True)  # a run before its first checkpoint, or one killed then
    assert no_checkpoint(str(run)) == (f"{run} is a folder with no checkpoint (ckpt.pt) in or below it; "
                                       "`python train.py --size=cpu --variant=baseline` writes one")
    for path in (tmp_path / "runs" / "cpu_bov" / "ckpt.pt", tmp_path / "out" / "cpu_nope" / "ckpt.pt",
                 tmp_path / "out" / "huge_bov" / "ckpt.pt", tmp_path / "out" / "cpu_bov" / "model.pt", tmp_path / "out"):
        assert no_checkpoint(str(path)) == f"no checkpoint at {path}; `python train.py` writes one"


def test_a_checkpoint_folder_without_access_or_with_a_folder_as_ckpt_pt_says_so(tmp_path, monkeypatch):
    """Both were 'a folder with no checkpoint (ckpt.pt) in or below it' (from a review run as a user other than root)."""
    from model import no_checkpoint
    (tmp_path / "run" / "ckpt.pt").mkdir(parents=True)
    assert no_checkpoint(str(tmp_path / "run")) == f"{tmp_path / 'run' / 'ckpt.pt'} is a folder, not a checkpoint file"
    (tmp_path / "run2").mkdir()
    denied = {str(tmp_path / "run"), str(tmp_path / "run2")}
    access = os.access  # chmod 000 does not stop root, who runs the tests here: the check is os.access's answer
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and os.fspath(p) not in denied)
    assert no_checkpoint(str(tmp_path / "run")) == f"cannot read the folder {tmp_path / 'run'}: permission denied"
    assert no_checkpoint(str(tmp_path / "run2" / "ckpt.pt")) == f"cannot read the folder {tmp_path / 'run2'}: permission denied"


def test_the_preset_listing_is_a_table(monkeypatch):
    import model
    from model import describe_presets, layer_list
    assert [layer_list(t) for t in [(), (4, 5), tuple(range(16, 24)), tuple(range(1, 24, 2)), (0, 2, 3), (1, 3, 5), (3, 4, 5)]] == \
        ["-", "4,5", "16-23", "1,3,...,23", "0,2,3", "1,3,5", "3-5"]
    table = lambda lines: [line for line in lines if ": not built (" not in line]  # (a researcher's may be there)
    lines = describe_presets("paper_780m").splitlines()
    assert len({len(line) for line in table(lines)}) == 1 and len(lines) == len(VARIANTS) + 1  # columns line up
    # a researcher's variant with its own layers, and a long name: a line saying so where a size lacks the layers
    monkeypatch.setitem(model.VARIANTS, "bov_on_layers_8_to_11", model._v((8, 9, 10, 11), "table"))
    lines = describe_presets("cpu").splitlines()
    assert len({len(line) for line in table(lines)}) == 1 and len(lines) == len(model.VARIANTS) + 1
    assert lines[-1] == "bov_on_layers_8_to_11: not built (bov_layers as a list must hold distinct layer indices in [0, 6), got (8, 9, 10, 11))"
    assert describe_presets("paper_135m").splitlines()[-1].startswith("bov_on_layers_8_to_11 8-11 ")


def test_the_scripts_start_without_importing_torch_dynamo():
    """torch._dynamo costs over a second to import: only a run that compiles should pay it (it came in
    once through a @torch.compiler.disable decorator on the offload fetch, evaluated at import), nor should building
    a model: a plan's GPT.meta, or sample.py's and eval.py's GPT (an Embedding's own init, or torch.arange, on the meta
    device imported it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import sys, model, sample, train, bench, eval; from model import GPT, GPTConfig\n"  # nor a plan, nor a model built
            "GPT.meta(GPTConfig.preset('paper_135m', 'bov')); GPT(GPTConfig.preset('cpu', 'bov', n_layer=2, vocab_size=64))\n"
            "print('torch._dynamo' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (0, "False\n"), r.stderr


def test_the_preset_listing_and_a_reader_that_leaves(monkeypatch, capsys):
    """`python model.py` lists every variant; piped into a reader that has gone (`| head`), it stops quietly."""
    cmd, here = [sys.executable, "model.py", "--size", "cpu"], os.path.dirname(os.path.abspath(__file__))
    # The two command-line runs (checked at the end) start first: their torch imports overlap the in-process part.
    p = subprocess.Popen(cmd, cwd=here, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # the reader leaves before anything is written
    with open("/dev/full", "w") as full:  # a full disk is one line
        on_full = subprocess.Popen(cmd, cwd=here, stdout=full, stderr=subprocess.PIPE, text=True)
    monkeypatch.setattr(sys, "argv", cmd[1:])
    runpy.run_path(os.path.join(here, "model.py"), run_name="__main__")  # in-process: one torch import fewer
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("sizes: ") and all(f"\n{name} " in out or f"\n{name}: not built (" in out
                                                           for name in VARIANTS)
    def ctrl_c(*_):  # Ctrl-C while the listing's models are built (inside torch)
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(torch.nn.Linear, "reset_parameters", ctrl_c)
        with pytest.raises(SystemExit) as e:
            runpy.run_path(os.path.join(here, "model.py"), run_name="__main__")
    assert e.value.code == 130 and capsys.readouterr() == ("", "model.py: interrupted\n")
    monkeypatch.setattr(sys, "argv", ["model.py", "--help"])  # the help goes the listing's way, in-process
    full = open("/dev/full", "w")
    monkeypatch.setattr(sys, "stdout", full)
    with pytest.raises(SystemExit) as e:
        runpy.run_path(os.path.join(here, "model.py"), run_name="__main__")
    monkeypatch.undo()
    with contextlib.suppress(OSError):  # what the help left in its buffer (model.py points fd 1, not this file, at /dev/null)
        full.close()
    assert e.value.code == "model.py: error: cannot write the help to stdout: No space left on device"
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0 and err == ""
    r = finish(on_full, 120)
    assert r.returncode == 1 and r.stderr == "model.py: error: cannot write the listing to stdout: No space left on device\n"


# ---------------------------------------------------------------------------- from a mutation audit of model.py

def test_ids_empty_or_int32_and_cache_lengths():
    """int32 ids give int64's logits (also through a cache and generate); an empty sequence and a cache of 0
    positions are refused (0 would read as "block_size"); a config edited after it was built is checked again."""
    model = build(tiny("bov"))
    idx = batch(model.config)
    assert torch.equal(model(idx.int())[0], model(idx)[0])
    cache = model.new_cache(2)
    assert torch.equal(model(idx.int(), cache=cache)[0], model(idx)[0])
    assert torch.equal(model.generate(idx.int(), 3, temperature=0), model.generate(idx, 3, temperature=0))
    empty = torch.zeros(1, 0, dtype=torch.long)
    for call in (lambda: model(empty), lambda: model.generate(empty, 1)):
        with pytest.raises(ValueError, match="empty sequence"):
            call()
    with pytest.raises(ValueError, match=r"not 0$"):
        model.new_cache(1, 0)
    cfg = model.config
    with pytest.raises(ValueError, match=r"^a KV cache holds 1 to block_size = 256 positions, not 300$"):
        model_module.KVCache(cfg, 1, 300, torch.float64, "cpu")  # built by hand: no rotary tables past block_size
    with pytest.raises(ValueError, match=r"^empty batch: idx needs at least one sequence$"):
        model(torch.zeros(0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^a batch of 2 sequences, but the KV cache holds 1$"):
        model(idx, cache=model.new_cache(1))
    cfg = tiny()
    cfg.n_head = 5
    with pytest.raises(ValueError, match="not divisible"):
        GPT(cfg)


def test_a_failed_save_keeps_the_last_checkpoint_and_no_temporary(tmp_path, monkeypatch):
    model = build(tiny("bov"))
    path = tmp_path / "new" / "run" / "ckpt.pt"  # folders made as needed
    model.save_checkpoint(str(path), step=1)
    before = path.read_bytes()
    def full_disk(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise RuntimeError("unexpected pos 512 vs 448")
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        model.save_checkpoint(str(path), step=2)
    assert path.read_bytes() == before and os.listdir(path.parent) == ["ckpt.pt"]
    monkeypatch.undo()
    assert GPT.from_checkpoint(str(path))[1]["step"] == 1


def test_a_record_without_a_crc_does_not_turn_the_checks_off(tmp_path):
    """An empty tensor's record has CRC 0, as all records of a zip saved with CRCs off: the others are still checked."""
    model = build(tiny("bov"))
    path = tmp_path / "ckpt.pt"
    model.save_checkpoint(str(path), empty=torch.empty(0))
    assert any(r.CRC == 0 for r in zipfile.ZipFile(path).infolist())
    flip_tensor_byte(path)
    with pytest.raises(ValueError, match="fails the zip's CRC-32"):
        GPT.from_checkpoint(str(path))


def test_a_folder_names_four_of_the_checkpoints_below_it(tmp_path):
    for i in range(5):
        (tmp_path / f"sub{i}").mkdir()
        (tmp_path / f"sub{i}" / "ckpt.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as e:
        GPT.from_checkpoint(str(tmp_path))
    assert str(e.value) == (f"{tmp_path} is a folder without ckpt.pt; checkpoints below it: "
                            + ", ".join(str(tmp_path / f"sub{i}" / "ckpt.pt") for i in range(4)) + ", ...")


def test_cache_and_table_bytes_default_to_bfloat16():
    cfg = tiny("bov")
    assert cfg.kv_cache_bytes(1, 1) == cfg.kv_cache_bytes(1, 1, torch.bfloat16) == cfg.kv_cache_bytes(1, 1, torch.float32) // 2 + 2
    assert cfg.table_bytes() == cfg.table_bytes(torch.bfloat16) == cfg.table_bytes(torch.float32) // 2
