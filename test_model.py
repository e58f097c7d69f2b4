"""model.py: the presets, the value-vector grid, the KV-cache decode, offloaded tables and the accounting."""
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from bench import SDPA_FLOPS  # SDPA's CPU kernels, which FlopCounterMode does not know
from conftest import save_checkpoint, seeded, tiny
from model import GPT, GPTConfig, SIZES, VARIANTS

TABLE_VARIANTS = [v for v in VARIANTS if tiny(v).n_tables()]


def batch(cfg, B=2, T=24, seed=0):
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))

# -----------------------------------------------------------------------------
# presets


def test_sizes_and_variants():
    shapes = {s: (c.n_layer, c.n_embd, c.n_head, c.head_dim, c.block_size, c.windows())
              for s in SIZES for c in [GPTConfig.preset(s)]}
    assert shapes == {"paper_135m": (12, 768, 6, 128, 2048, [512, 512, 512, 2048] * 3),
                      "paper_780m": (24, 1536, 12, 128, 2048, [512, 512, 512, 2048] * 6),
                      "cpu": (6, 192, 6, 32, 256, [128, 128, 128, 256, 128, 256])}
    assert list(VARIANTS) == ["baseline", "bov"] + [f"t1_r{i:02d}" for i in range(1, 14)] + [
        "bov_shared_table", "bov_fixed_coeff", "bov_every_layer", "bov_keep_v", "value_embed_gated", "resformer",
        "svformer"]
    targets = {v: GPTConfig.preset("paper_135m", v).target_layers() for v in VARIANTS}
    assert targets["bov"] == targets["t1_r09"] == (8, 9, 10, 11)
    assert targets["t1_r07"] == targets["value_embed_gated"] == (1, 3, 5, 7, 9, 11)
    assert targets["svformer"] == targets["t1_r03"] == tuple(range(1, 12))  # layer 0 computes V1
    assert targets["bov_every_layer"] == tuple(range(12)) and targets["baseline"] == ()
    assert GPTConfig.preset("paper_780m", "bov").target_layers() == tuple(range(16, 24))
    assert GPTConfig.preset("cpu", "bov", bov_layers="3,5").target_layers() == (3, 5)  # as a command line gives it
    assert GPTConfig.preset("cpu", "bov", bov_layers=[5, 3]).target_layers() == (3, 5)
    v_free = {v: GPTConfig.preset("paper_135m", v).v_free_layers() for v in VARIANTS}
    assert [v for v in VARIANTS if v_free[v]] == ["bov", "t1_r03", "t1_r04", "t1_r05", "t1_r06", "bov_shared_table",
                                                  "bov_fixed_coeff", "bov_every_layer", "svformer"]


@pytest.mark.parametrize("args, message", [
    (("gpt2", "bov"), "unknown size 'gpt2'; choose one of paper_135m, paper_780m, cpu"),
    (("cpu", "boV"), "unknown variant 'boV'; choose one of baseline, bov, t1_r01"),
    (("cpu", "bov", dict(n_layers=4)), "unknown GPTConfig field 'n_layers'; fields are vocab_size, n_layer,"),
    (("cpu", "bov", dict(value_source="x1")), "value_source='x1': choose one of table, x0, v1, x"),
    (("cpu", "bov", dict(bov_layers="last")), "bov_layers='last': choose one of last_third, every_other, all, none"),
    (("cpu", "bov", dict(bov_layers=(4, 6))), "bov_layers=(4, 6): a 6-layer model has layers 0 to 5"),
    (("cpu", "t1_r06", dict(bov_layers=(0, 5))), "value_source=v1 cannot target layer 0, which computes V1"),
    (("cpu", "t1_r09", dict(value_coeff="gated")), "value_coeff=gated is nanochat's value embedding"),
    (("cpu", "t1_r09", dict(shared_table=True)), "shared_table needs value_source=table"),
])
def test_bad_presets_name_the_choices(args, message):
    size, variant, overrides = (*args, {})[:3]
    with pytest.raises(ValueError) as e:
        GPTConfig.preset(size, variant, **overrides)
    assert str(e.value).startswith(message)


def test_python_model_py_lists_every_preset():
    out = subprocess.run([sys.executable, "model.py", "--size", "paper_135m"], capture_output=True, text=True,
                         check=True).stdout
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert list(rows) == list(VARIANTS)
    assert rows["bov"] == ["8,9,10,11", "132,907,012", "100,663,296", "745,537,536"]
    assert rows["baseline"] == ["-", "135,266,304", "0", "759,693,312"]

# -----------------------------------------------------------------------------
# the value-vector grid


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_trains_and_starts_from_the_baselines_weights(variant):
    """Every layer draws a W_V, used or not, so one seed gives each variant the baseline's weights in every
    parameter they share (Table 1's rows differ only in the value path); and every parameter is set."""
    model, base = seeded(7, variant), dict(seeded(7, "baseline").named_parameters())
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name
        if name in base and variant != "value_embed_gated":  # its gates draw inside the layer loop
            assert torch.equal(p, base[name]), name
    idx = batch(model.config)
    _, loss = model.train()(idx, idx)
    loss.backward()
    coefficients = [p for n, p in model.named_parameters() if n.endswith(("gamma_v", "alpha_v", "beta_v"))]
    assert len(coefficients) == len(model.coefficients()) * (1 + (model.config.value_mix == "add"))
    assert all(p.grad.abs().item() > 0 for p in coefficients)  # eq. 5's gamma_v is trained


@pytest.mark.parametrize("variant", ["bov", "bov_shared_table"])
def test_bov_at_init_equals_x0_w_v(variant):
    """Section 5: E_v starts as RMSNorm(wte) W_V of its layer (a shared table: the first target layer's), so BoV's
    first forward is t1_r09's: to the bit over the whole vocabulary in one pass (the table init's own matmul)."""
    kw = dict(bov_layers=(5,)) if variant == "bov_shared_table" else {}
    bov, x0, base = seeded(7, variant, **kw), seeded(7, "t1_r09", **kw), seeded(7, "baseline")
    for table, layer in zip(bov.tables, bov.config.table_layers()):
        expected = F.rms_norm(base.wte.weight, (48,)) @ base.blocks[layer].attn.c_v.weight.T
        assert torch.equal(table.weight, expected)
    every_id = torch.arange(bov.config.vocab_size)[None, :64]
    assert torch.equal(bov(every_id)[0], x0(every_id)[0])
    assert (bov(every_id)[0] - base(every_id)[0]).abs().max() > 1e-3  # and the value path matters


def test_the_grid_computes_its_formulas():
    """v = gamma_v E_v[i] (eq. 5); a V + b V~ starts as V (a = 1, b = 0) and fixed add is 0.5 V + 0.5 V~; a
    fixed coefficient is the learned one at init; the gate is 3 sigmoid(W_g x[:12]), one per head."""
    idx = batch(tiny())
    logits = lambda m: m(idx)[0]
    same = lambda a, b: torch.testing.assert_close(logits(a), logits(b), rtol=0, atol=0)
    same(seeded(7, "t1_r13"), seeded(7, "baseline"))
    pairs = ("t1_r02", "baseline"), ("t1_r09", "t1_r08"), ("t1_r06", "t1_r05"), ("bov", "bov_fixed_coeff")
    for learned, fixed in pairs:
        same(seeded(7, learned), seeded(7, fixed))
    half, fixed = seeded(7, "t1_r13"), seeded(7, "t1_r12")
    with torch.no_grad():
        for i in (4, 5):
            half.blocks[i].attn.alpha_v.fill_(0.5), half.blocks[i].attn.beta_v.fill_(0.5)
    same(half, fixed)
    bov = seeded(7, "bov")  # doubling gamma_v and halving W_O of its layer: the same logits
    before = logits(bov)
    with torch.no_grad():
        bov.blocks[4].attn.gamma_v.mul_(2), bov.blocks[4].attn.c_proj.weight.div_(2)
    torch.testing.assert_close(logits(bov), before)
    gated, add = seeded(7, "value_embed_gated", bov_layers=(4, 5)), seeded(7, "bov_keep_v")
    state = {k: v for k, v in gated.state_dict().items() if "ve_gate" not in k}
    for i in (4, 5):
        gated.blocks[i].attn.ve_gate.weight.data.zero_()  # W_g = 0: the gate is 3 sigmoid(0) = 1.5 everywhere
        state.update({f"blocks.{i}.attn.alpha_v": torch.ones(1), f"blocks.{i}.attn.beta_v": torch.full((1,), 1.5)})
    add.load_state_dict(state)
    torch.testing.assert_close(logits(gated), logits(add))


def test_the_gate_reads_the_first_12_channels_per_head():
    model = seeded(0, "value_embed_gated")
    seen = {}
    model.blocks[5].attn.ve_gate.register_forward_hook(lambda m, a, out: seen.update(x=a[0], gate=out))
    model(batch(model.config))
    assert seen["x"].shape[-1] == 12 and seen["gate"].shape[-1] == 4  # one gate per head
    with torch.no_grad():
        model.blocks[5].attn.ve_gate.weight[:, :] = 0
        model.blocks[5].mlp.c_fc.weight[:, 12:] += 1  # nothing past channel 12 of its input reaches the gate
    model(batch(model.config))
    assert torch.equal(seen["gate"], torch.zeros_like(seen["gate"]))


def test_table_gradients_reach_only_the_rows_of_the_batch():
    model = seeded(0, "bov").train()
    idx = torch.randint(0, 40, (2, 30))
    model(idx, idx)[1].backward()
    present = torch.zeros(257, dtype=torch.bool)
    present[idx.unique()] = True
    for table in model.tables:
        assert torch.equal(table.weight.grad.abs().sum(dim=1) > 0, present)


def test_v1_is_layer_0s_own_v_and_trains_its_w_v():
    model = seeded(0, "t1_r06").train()
    with torch.no_grad():
        model.blocks[0].attn.c_proj.weight.zero_()  # layer 0's own output cut: W_V learns only through V1
    idx = batch(model.config)
    model(idx, idx)[1].backward()
    assert model.blocks[0].attn.c_v.weight.grad.abs().sum() > 0
    assert all(model.blocks[i].attn.c_v is None for i in (4, 5))


def test_the_trunk_equals_its_written_out_formula():
    """Pre-norm blocks, RoPE (base 100,000) then QK-norm, relu^2 MLP, untied head, soft-cap 15, and the
    sliding windows (cpu's SSSL at context 256: 128-token windows in layers 0-2 and 4)."""
    torch.manual_seed(0)
    model = seeded(0, "baseline", block_size=256, vocab_size=97)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # logits past the soft-cap's knee
    idx = batch(model.config, B=1, T=200)
    B, T, H, D = 1, 200, 4, 12
    rms = lambda t: F.rms_norm(t, (t.size(-1),))
    angles = torch.outer(torch.arange(T).float(), 100_000 ** -(torch.arange(0, D, 2).float() / D))
    cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]
    rope = lambda t: torch.cat([t[..., :6] * cos + t[..., 6:] * sin, t[..., 6:] * cos - t[..., :6] * sin], -1)
    back = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    x = rms(model.wte.weight[idx])
    for block, window in zip(model.blocks, [128, 128, 128, 256, 128, 256]):
        a, h = block.attn, rms(x)
        q, k = (rms(rope((h @ w.T).view(B, T, H, D))).transpose(1, 2) for w in (a.c_q.weight, a.c_k.weight))
        v = (h @ a.c_v.weight.T).view(B, T, H, D).transpose(1, 2)
        p = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill((back < 0) | (back >= window), -math.inf)
        p = p.softmax(-1)
        x = x + (p @ v).transpose(1, 2).reshape(B, T, H * D) @ a.c_proj.weight.T
        x = x + F.relu(rms(x) @ block.mlp.c_fc.weight.T).square() @ block.mlp.c_proj.weight.T
    expected = 15 * torch.tanh(rms(x) @ model.lm_head.weight.T / 15)
    logits = model(idx)[0]
    assert logits.abs().max() > 10
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)

# -----------------------------------------------------------------------------
# decoding: KV cache and offloaded tables


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_decode_with_cache_equals_without(variant):
    """The cache path (prefill, then one token a step; V-free layers reading table rows or V1 over their window)
    gives the no-cache path's tokens, past the 16-token short windows of this block_size-64 model."""
    model = seeded(1, variant, window_pattern="SL", block_size=64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("gamma_v", "beta_v")):
                p.fill_(1.7)  # a learned coefficient away from its init
    idx = batch(model.config, T=9)
    cached = model.generate(idx, 50, temperature=0)
    assert torch.equal(cached, model.generate(idx, 50, temperature=0, use_cache=False))
    cache = model.new_cache(2)  # and step by step, the logits of the full forward
    full, _ = model(cached[:, :59])
    steps = [model(cached[:, :9], cache=cache)[0]]
    steps += [model(cached[:, t:t + 1], cache=cache)[0] for t in range(9, 59)]
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 8:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["bov", "t1_r06", "value_embed_gated"])
def test_decode_under_bf16_autocast_gives_the_full_forwards_logits(variant):
    """CUDA's default: float32 weights, a bf16 KV cache (autocast's dtype), bf16 attention; the step logits
    within bf16's rounding of the full forward's (the baseline's differ by up to 0.06 too)."""
    model = seeded(1, variant)
    with torch.autocast("cpu", torch.bfloat16):
        tokens = model.generate(batch(model.config, T=9), 20, temperature=0, use_cache=False)
        full, cache = model(tokens[:, :-1])[0], model.new_cache(2)
        steps = [model(tokens[:, :9], cache=cache)[0]]
        steps += [model(tokens[:, t:t + 1], cache=cache)[0] for t in range(9, 28)]
    assert cache.k[0].dtype == torch.bfloat16
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 8:], rtol=0, atol=0.15)


@pytest.mark.parametrize("variant", TABLE_VARIANTS)
def test_offloaded_tables_give_the_same_tokens_and_fetch_each_row_once(variant):
    model, offloaded = seeded(1, variant), seeded(1, variant).offload_tables("cpu")
    assert all(t.weight.data_ptr() == offloaded.offload.host[i].data_ptr() for i, t in enumerate(offloaded.tables))
    idx = batch(model.config, T=9)
    out = offloaded.generate(idx, 30, temperature=0)
    assert torch.equal(out, model.generate(idx, 30, temperature=0))
    distinct = out[:, :-1].unique().numel()  # the last token is never fed back
    assert offloaded.offload.rows.shape == (len(model.tables), distinct, 48)  # the rows of the ids seen, once
    offloaded.generate(idx, 5, temperature=0)  # ids seen before cross no more
    assert offloaded.offload.rows.shape[1] == distinct


def test_a_full_cache_restarts_from_the_last_half_block_and_sampling_is_seeded():
    model = seeded(1, "bov", block_size=32)
    idx = batch(model.config, B=1, T=30)
    tokens = list(model.stream(idx, 10, temperature=0))  # 30 + 2 fill the cache; the 4th restarts from 16 tokens
    context = torch.cat([idx, *tokens], 1)
    assert torch.equal(tokens[3][:, 0], model(context[:, 17:33])[0][:, -1].argmax(-1))
    sample = lambda seed: model.generate(idx, 8, top_k=5, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(sample(3), sample(3)) and not torch.equal(sample(3), sample(4))
    logits = model(torch.cat([idx, sample(3)[:, 30:31]], 1)[:, :30])[0][0, -1]
    assert sample(3)[0, 30] in logits.topk(5).indices  # top_k keeps the 5 likeliest


def test_token_ids_past_the_vocabulary_are_refused():
    model = seeded(0, "bov")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 257\), the vocabulary; got 3 to 257"):
        model.generate(torch.tensor([[3, 257]]), 1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cache_bytes_equal_the_analytic_formula(variant):
    """K in every layer, V in all but the V-free layers, an int32 id a position where a V-free layer reads a table."""
    cfg = tiny(variant)
    cache = GPT(cfg).new_cache(3, 40)
    L, d = cfg.n_layer, cfg.n_embd
    expected = 3 * 40 * ((2 * L - len(cfg.v_free_layers())) * d * 4 + 4 * cfg.caches_ids())
    assert cache.nbytes() == cfg.kv_cache_bytes(3, 40, torch.float32) == expected
    assert (cache.ids is not None) == (variant in ("bov", "bov_shared_table", "bov_fixed_coeff", "bov_every_layer"))


def test_eq6_breakeven_at_t_equal_vocab():
    """Eq. 6: BoV's V-cache saving, (L/3) d T per sequence, equals its tables, (L/3) |V| d, at T = |V| (the int32
    ids aside); for B sequences sharing the tables at B T = |V|."""
    base, bov = GPTConfig.preset("paper_135m"), GPTConfig.preset("paper_135m", "bov")
    saving = lambda B, T: base.kv_cache_bytes(B, T) - bov.kv_cache_bytes(B, T) - bov.table_bytes()
    assert bov.table_bytes() == 4 * 32768 * 768 * 2
    assert saving(1, 32768) == -4 * 32768 and saving(1, 32790) > 0 > saving(1, 32789)
    assert saving(32, 1024) == -4 * 32 * 1024 and saving(32, 1025) > 0

# -----------------------------------------------------------------------------
# accounting and optimisation


def test_flops_and_parameters_are_table_6s():
    flops = {(s, v): GPT(GPTConfig.preset(s, v), device="meta").estimate_flops()
             for s in ("paper_135m", "paper_780m") for v in ("baseline", "bov")}
    assert flops == {("paper_135m", "baseline"): 759_693_312, ("paper_135m", "bov"): 745_537_536,
                     ("paper_780m", "baseline"): 4_775_215_104, ("paper_780m", "bov"): 4_661_968_896}
    assert round(3.91e19 / flops["paper_780m", "baseline"] / 1e9, 2) == 8.19  # Section 5's tokens
    assert round(3.91e19 / flops["paper_780m", "bov"] / 1e9, 2) == 8.39
    n = GPT(GPTConfig.preset("paper_135m", "bov"), device="meta").num_params()
    assert n == dict(dense=135_266_304 - 4 * 768 ** 2 + 4, tables=4 * 32768 * 768,
                     scaling=140 * 768 ** 2 + 32768 * 768)
    n = GPT(GPTConfig.preset("paper_780m", "bov"), device="meta").num_params()
    assert (round(n["dense"] / 1e6, 1), round(n["tables"] / 1e6, 1)) == (761.3, 402.7)


@pytest.mark.parametrize("variant", VARIANTS)
def test_estimate_flops_equals_the_flop_counter(variant):
    """Every window the whole context (a masked SDPA counts all T x T scores), so the count is exact: a matmul
    applied twice, or a W_V that never runs, would show."""
    model = GPT(tiny(variant, window_pattern="L"))
    idx = batch(model.config, T=64)
    with FlopCounterMode(display=False, custom_mapping=SDPA_FLOPS) as counter:
        model(idx, idx)[1].backward()
    assert counter.get_total_flops() == model.estimate_flops() * idx.numel()


def test_optimizer_groups_and_rates():
    model = GPT(GPTConfig.preset("cpu", "bov"))
    muon, adamw = model.configure_optimizers()
    scale = (192 / 768) ** -0.5
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    matrices = {id(p) for p in model.blocks.parameters() if p.dim() == 2}
    assert {id(p) for p in muon.param_groups[0]["params"]} == matrices
    assert muon.param_groups[0]["lr"] == 0.02 and muon.param_groups[0]["weight_decay"] == 0.28
    groups = [([id(p) for p in g["params"]], g["lr"], g["initial_lr"]) for g in adamw.param_groups]
    assert groups == [([id(model.wte.weight)], 0.3 * scale, 0.3 * scale),
                      ([id(model.lm_head.weight)], 0.008 * scale, 0.008 * scale),
                      ([id(t.weight) for t in model.tables], 0.15 * scale, 0.15 * scale),
                      ([id(model.blocks[4].attn.gamma_v), id(model.blocks[5].attn.gamma_v)], 0.5, 0.5)]
    assert model.coefficients() == {4: {"gamma_v": 1.0}, 5: {"gamma_v": 1.0}}
    assert seeded(0, "t1_r11").coefficients() == {i: {"alpha_v": 1.0, "beta_v": 0.0} for i in (4, 5)}


def test_checkpoint_round_trip(tmp_path):
    model = seeded(3, "bov_keep_v", bov_layers="3,5")
    save_checkpoint(model, tmp_path / "ckpt.pt", step=7)
    loaded, ckpt = GPT.from_checkpoint(str(tmp_path))  # a run's out_dir names its ckpt.pt
    assert ckpt["step"] == 7 and loaded.config == model.config and not loaded.training
    idx = batch(model.config)
    assert torch.equal(loaded(idx)[0], model(idx)[0])
