"""Tests of sample.py and bench.py, in-process, on tiny models (CPU, seconds)."""
import contextlib
import io
import json
import re
from dataclasses import replace

import matplotlib.axes
import pytest
import torch

import bench
import sample
from conftest import BYTE_TOKENIZER, tiny
from model import GPT, GPTConfig, load_tokenizer

ENC = load_tokenizer(BYTE_TOKENIZER)
BOS = ENC.n_vocab - 1


def run_sample(capsys, checkpoint, *args):
    """sample.main in-process -> (stdout, stderr)"""
    capsys.readouterr()
    sample.main(["--ckpt", str(checkpoint), *map(str, args)])
    return capsys.readouterr()


def rates(err):
    return re.findall(r"^prefill [\d,.]+ tok/s, decode [\d,.]+ tok/s$", err, re.M)

# ---------------------------------------------------------------------------- sample.py


def test_greedy_text_is_the_models_with_and_without_offloaded_tables(checkpoint, capsys):
    model, _ = GPT.from_checkpoint(checkpoint)
    ids = model.generate(torch.tensor([[BOS, *b"To be"]]), 40, temperature=0)[0].tolist()
    args = ("--start", "To be", "--temperature", 0, "--max_new_tokens", 40)
    plain = run_sample(capsys, checkpoint, *args)
    offloaded = run_sample(capsys, checkpoint, *args, "--offload_tables")
    assert plain.out == offloaded.out == ENC.decode(ids[1:]) + "\n"
    rows = 2 * len(set(ids[:-1]))  # 2 tables; each distinct token fed (all but the last) crosses once
    assert offloaded.err.splitlines()[1:] == [f"offload: {rows:,} table rows fetched, {rows * 48 * 4:,} bytes "
                                              "moved to cpu"]
    assert len(rates(plain.err)) == 1 and "offload" not in plain.err


def test_samples_are_the_models_draws_from_the_seed(checkpoint, capsys):
    """Two samples drawn one after the other from one generator; random bytes, so many split or invalid UTF-8
    sequences: the streamed text must still equal the tokenizer's decode of the whole sample."""
    model, _ = GPT.from_checkpoint(checkpoint)
    g = torch.Generator().manual_seed(7)
    draw = lambda: model.generate(torch.tensor([[BOS]]), 80, temperature=0.8, top_k=200, generator=g)[0, 1:]
    texts = [ENC.decode(draw().tolist()) for _ in range(2)]
    out, err = run_sample(capsys, checkpoint, "--seed", 7, "--max_new_tokens", 80, "--num_samples", 2)
    assert out == texts[0] + "\n---------------\n" + texts[1] + "\n"
    assert texts[0] != texts[1] and "\ufffd" in out  # the check covers invalid bytes
    assert len(rates(err)) == 2 and err == "".join(line + "\n" for line in rates(err))


def test_text_streams_as_the_tokens_come_and_a_split_character_prints_once_whole(checkpoint, capsys, monkeypatch):
    written = []  # stdout before each token is produced

    def stream(self, idx, max_new_tokens, *args, **kwargs):
        assert idx.tolist() == [[BOS]]
        for b in "né→".encode():  # byte tokens: é is 2, → is 3
            written.append(capsys.readouterr().out)
            yield torch.tensor([[b]])
    monkeypatch.setattr(GPT, "stream", stream)
    written.append(run_sample(capsys, checkpoint).out)
    assert written == ["", "n", "", "é", "", "", "→\n"]


def test_a_prompt_from_a_file_is_its_text(checkpoint, capsys, tmp_path):
    text = "Zürich\n東京 → "
    (tmp_path / "prompt.txt").write_text(text, encoding="utf-8")
    args = ("--temperature", 0, "--max_new_tokens", 10)
    from_file = run_sample(capsys, checkpoint, *args, "--start", f"FILE:{tmp_path / 'prompt.txt'}")
    assert from_file.out == run_sample(capsys, checkpoint, *args, "--start", text).out
    assert from_file.out.startswith(text) and len(from_file.out) > len(text) + 1


def test_a_prompt_longer_than_the_context_is_cropped_from_the_left_and_said_once(checkpoint, capsys):
    text = "".join(chr(ord("a") + i % 26) for i in range(100))  # 100 byte tokens, after <|bos|>; block_size 64
    args = ("--temperature", 0, "--max_new_tokens", 10, "--num_samples", 2)
    long = run_sample(capsys, checkpoint, *args, "--start", text)
    kept = run_sample(capsys, checkpoint, *args, "--start", text[-63:])  # <|bos|> + 63 fill the context
    assert long.out == kept.out and long.out.startswith(text[-63:])
    assert long.err.count("cropped") == 1 and "cropped" not in kept.err


# ---------------------------------------------------------------------------- bench.py


TINY = ["--config", "n_embd=48,n_head=4,vocab_size=257,block_size=64", "--contexts", "16,40", "--steps", "4",
        "--batch", "2", "--decode_batch", "3", "--serve_batch", "4", "--rounds", "1"]


@pytest.fixture(scope="module")
def bench_json():
    """bench.py --json at the tiny size (one round): the table's numbers."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        bench.main(["--json", *TINY])
    return json.loads(out.getvalue())


def test_bench_json_has_every_number(bench_json):
    r = bench_json
    assert set(r) == {"variants", "size", "config", "device", "dtype", "threads", "rounds", "steps",
                      "decode_batch", "torch", "dense_params", "table_params", "flops_per_token", "flops_windows_L",
                      "tokens_paper_135m", "tokens_paper_780m", "kv_bytes_per_position", "table_bytes",
                      "breakeven_context", "prefill_tok_s", "decode_tok_s", "train_step_ms"}
    assert (r["variants"], r["size"], r["dtype"]) == (["baseline", "bov"], "cpu", "float32")
    assert r["config"] == dict(n_embd=48, n_head=4, vocab_size=257, block_size=64)
    speeds = [*r["prefill_tok_s"].items(), *r["decode_tok_s"].items(), *r["train_step_ms"].items()]
    assert [k for k, _ in speeds] == ["16", "40", "16", "40", "2"]
    for _, m in speeds:  # one round: the medians are its numbers, the ratio theirs
        assert m["a"] > 0 and m["b"] > 0 and m["q1"] == m["ratio"] == m["q3"] == pytest.approx(m["b"] / m["a"])


def test_bench_accounting_is_the_models(bench_json):
    r = bench_json
    models = [GPT(tiny(v), device="meta") for v in ("baseline", "bov")]
    assert [r["dense_params"][k] for k in "ab"] == [m.num_params()["dense"] for m in models]
    assert [r["table_params"][k] for k in "ab"] == [0, 2 * 257 * 48]
    # block_size 64: every window is the whole context, so the estimate is the same with windows L
    estimates = [m.estimate_flops() for m in models]
    assert [r["flops_per_token"][k] for k in "ab"] == estimates == r["flops_windows_L"]["estimate"]
    assert [r["flops_windows_L"][k] for k in "ab"] == estimates
    tokens = r["tokens_paper_780m"]
    assert (round(tokens["a"] / 1e9, 2), round(tokens["b"] / 1e9, 2)) == (8.19, 8.39)  # Section 5's


@pytest.mark.parametrize("variant", ["baseline", "bov", "t1_r13", "bov_shared_table", "value_embed_gated"])
def test_bench_counted_flops_equal_the_estimate_with_sliding_windows(variant):
    """At block_size 512 the S layers' windows are 128: count_flops makes them the whole context first."""
    cfg = tiny(variant, block_size=512)
    assert cfg.windows()[0] == 128
    counted, estimate = bench.count_flops(cfg)
    assert counted == estimate == GPT(replace(cfg, window_pattern="L"), "meta").estimate_flops()


def test_bench_cache_bytes_allocated_equal_the_analytic(bench_json):
    kv = bench_json["kv_bytes_per_position"]
    assert [kv["a"], kv["b"]] == kv["analytic"] == [2 * 6 * 48 * 4, (2 * 6 - 2) * 48 * 4 + 4]  # float32; BoV: ids
    assert bench_json["table_bytes"] == dict(a=0, b=2 * 257 * 48 * 4)


@pytest.mark.parametrize("a, b, tokens", [("baseline", "bov", 1), ("bov", "baseline", 1),
                                          ("baseline", "bov_shared_table", 1 / 4), ("baseline", "bov_every_layer", 1),
                                          ("baseline", "svformer", 0)])
@pytest.mark.parametrize("batch", [1, 32])
def test_breakeven_is_eq6(a, b, tokens, batch):
    """B T = tokens x |V|; at that context B's cache and tables take what A's do, the ids aside."""
    ca, cb = (GPTConfig.preset("paper_135m", v) for v in (a, b))
    T = bench.breakeven(ca, cb, batch)
    assert batch * T == tokens * 32768
    memory = lambda cfg: cfg.kv_cache_bytes(batch, T) - 4 * batch * T * cfg.caches_ids() + cfg.table_bytes()
    assert memory(ca) == memory(cb)


def test_bench_breakeven_row_and_none_where_b_saves_no_v(bench_json):
    assert bench_json["breakeven_context"] == dict(one=257, batch=257 / 4, serve_batch=4)
    assert bench.breakeven(*(GPTConfig.preset("cpu", v) for v in ("baseline", "t1_r02"))) is None


def test_bench_table_has_a_row_per_number_and_says_what_is_equal(bench_json):
    lines = bench.report(bench_json).splitlines()
    assert lines[2:4] == ["| | baseline | bov | B/A |", "|---|---:|---:|---:|"]
    rows = [[cell.strip() for cell in line.split("|")] for line in lines[4:]]
    assert all(len(r) == 6 and r[0] == r[-1] == "" for r in rows) and len(rows) == 8 + 2 + 2 + 2 + 1
    labels = [r[1] for r in rows]
    assert "FLOPs/token, every window L: FlopCounterMode == estimate" in labels
    assert "KV-cache bytes/position, KVCache.nbytes() == kv_cache_bytes" in labels
    assert rows[labels.index("eq. 6 breakeven context, one sequence")][2:5] == ["", "257", ""]
    assert rows[labels.index("decode tok/s at context 40, 3 sequences")][4].count("-") == 1  # ratio (q1-q3)
    off = dict(bench_json, kv_bytes_per_position=dict(bench_json["kv_bytes_per_position"], a=1.0))
    assert "KV-cache bytes/position, KVCache.nbytes() != kv_cache_bytes" in bench.report(off)


def test_bench_interleaves_a_and_b(monkeypatch):
    """Prefills in the round's order, then the decode steps taking turns (B A, A B, ...), then the train steps."""
    calls = []

    class Fake:
        def __init__(self, name):
            self.prefill = lambda c, n: calls.append((name, "prefill", c, n))
            self.step = lambda tok: calls.append((name, "step"))
            self.train_step = lambda: calls.append((name, "train"))
    monkeypatch.setattr(bench, "timed", lambda fn, *args: (fn(*args), 0.5))
    args = bench.parse_args(["--contexts", "10", "--steps", "3", "--decode_batch", "2", "--batch", "4"])
    out = bench.run_round([Fake("A"), Fake("B")], args, torch.float32, (1, 0))
    assert calls == [("B", "prefill", 10, 7), ("A", "prefill", 10, 7), ("B", "step"), ("A", "step"),
                     ("A", "step"), ("B", "step"), ("B", "step"), ("A", "step"), ("B", "train"), ("A", "train")]
    assert out == dict(prefill_tok_s={10: [2 * 7 / 0.5] * 2}, decode_tok_s={10: [2 * 3 / 1.5] * 2},
                       train_step_ms={4: [500.0] * 2})


def test_paired_is_the_median_ratio_and_its_quartiles():
    m = bench.paired([1.0, 2.0, 4.0, 1.0], [2.0, 2.0, 2.0, 1.0])  # ratios 2, 1, 0.5, 1
    assert m == dict(a=1.5, b=2.0, ratio=1.0, q1=0.875, q3=1.25)


def metrics(path, variant, coefficients, seed=1337, final=2.5):
    """A train.py metrics.jsonl with two evaluations."""
    path.parent.mkdir()
    records = [{"type": "config", "size": "cpu", "variant": variant, "seed": seed},
               {"type": "train", "step": 0, "loss": 8.0, "lrm": 0.1}]
    records += [{"type": "eval", "step": s, "tokens": 100 * s, "flops": 1e9 * s, "val_loss": 2.0, "val_bpb": bpb,
                 "coefficients": coefficients} for s, bpb in ((0, 3.0), (2, final))]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_bench_plot_draws_fig5a_the_val_curves_and_the_coefficients(tmp_path, monkeypatch):
    lines = []  # (x, y, label) of every line drawn
    draw = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **kw:
                        lines.append((list(a[0]), list(a[1]), kw.get("label"))) or draw(ax, *a, **kw))
    paths = [metrics(tmp_path / "cpu_baseline" / "metrics.jsonl", "baseline", {}),
             metrics(tmp_path / "cpu_bov" / "metrics.jsonl", "bov", {"4": {"gamma_v": 1.3}, "5": {"gamma_v": 0.9}})]
    bench.main(["--plot", *paths, "--plot_dir", str(tmp_path / "plots")])
    pngs = sorted((tmp_path / "plots").iterdir())
    assert [p.name for p in pngs] == ["coefficients.png", "fig5a.png", "val_curves.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    fig5a, rest = lines[:4], lines[4:]
    assert [label for *_, label in fig5a] == [f"vocab {v}, % of the {c} cache" for v in ("32,768", "151,936")
                                              for c in ("K+V", "V")]
    contexts, kv = fig5a[0][:2]
    k = contexts.index(32768)  # T = |V|: BoV's ids tip the saving just below 0; past it BoV saves, up to 1/6 of K+V
    assert kv[k] < 0 < kv[k + 1] and 15 < kv[-1] < 100 / 6 and fig5a[1][1] == [2 * s for s in kv]
    assert rest == [([0, 200], [3.0, 2.5], "cpu_baseline"), ([0, 200], [3.0, 2.5], "cpu_bov"),
                    ([4, 5], [1.3, 0.9], "cpu_bov: gamma_v")]


def test_bench_table_of_trained_runs_by_variant_and_seed(tmp_path, capsys):
    """Table 1 in miniature: each run's last val bpb by seed, the mean, its difference from the baseline's mean
    (marked noise under twice the baseline's seed spread), the paper's difference, and the last coefficients."""
    runs = [("baseline", 1, 2.10, {}), ("baseline", 2, 2.11, {}), ("baseline", 1337, 2.12, {}),
            ("bov", 1, 2.05, {"4": {"gamma_v": 9.0}}),
            ("bov", 1337, 2.07, {"4": {"gamma_v": 2.25}, "5": {"gamma_v": 0.5}}),
            ("t1_r11", 1337, 2.09, {"4": {"alpha_v": 1.0, "beta_v": 0.25}})]
    paths = [metrics(tmp_path / f"{v}_{seed}" / "metrics.jsonl", v, c, seed, bpb) for v, seed, bpb, c in runs]
    bench.main(["--table", *paths, "--plot_dir", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == [
        "| variant | paper | computes | seed 1 | seed 2 | seed 1337 | mean | vs baseline | paper "
        "| last gamma_v (a, b) by layer |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
        "| baseline | Table 1 row 1 | V | 2.100 | 2.110 | 2.120 | 2.110 | +0.000 | +0.000 |  |",
        "| bov | Sections 4-5 | γ E_v[i] in layers 4,5 | 2.050 |  | 2.070 | 2.060 | -0.050 | -0.009 "
        "| 4: 2.25; 5: 0.50 |",
        "| t1_r11 | Table 1 row 11 | a V + b V1 in layers 4,5 |  |  | 2.090 | 2.090 | -0.020 (noise) | -0.006 "
        "| 4: 1.00, 0.25 |"]
    assert (tmp_path / "table1.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_config_reads_numbers_and_booleans():
    args = bench.parse_args(["--config", "n_embd=48,shared_table=False,window_pattern=SL"])
    assert args.config == dict(n_embd=48, shared_table=False, window_pattern="SL")
