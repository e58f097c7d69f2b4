"""Tests of train.py: budget arithmetic, the loader, bits per byte, exact resume, DDP, bad input."""

import copy
import hashlib
import io
import random
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import eval as ev
import train
from conftest import builds, finish, first_gradient_spy, flip_tensor_byte
from model import GPT, GPTConfig
from prepare_data import load_meta, load_tokens

HERE = os.path.dirname(os.path.abspath(__file__))
# A model small enough that a step takes milliseconds on a CPU.
TINY = ["--n_layer=2", "--n_embd=32", "--n_head=2", "--block_size=32", "--device_batch_size=4",
        "--total_batch_tokens=128", "--warmup_iters=2", "--eval_tokens=2048", "--device=cpu", "--seed=3",
        "--log_interval=1"]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A small corpus prepared by prepare_data.py: short and long documents, so the loader packs and cuts."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = "the of and to a in that is was he for it with as his on be at by i this had not are but from".split()
    for i in range(60):
        n = 30 if i % 3 else 800  # every third document is longer than a row
        text = " ".join(rng.choice(words, size=n)) + ".\n"
        (root / f"doc{i:03d}.txt").write_text(text)
    out = root / "data"
    subprocess.run([sys.executable, "prepare_data.py", f"--source=files:{root}/*.txt", f"--out_dir={out}",
                    "--vocab_size=300", "--val_tokens=3000"], cwd=HERE, check=True, capture_output=True)
    return str(out)


def start_train(args, **kw):
    """`python train.py ARGS`, started now and collected with finish(): a test starts its runs early, so that
    their torch imports overlap each other and the test's in-process work."""
    return subprocess.Popen([sys.executable, "train.py", *args], cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def cli_error_line(e):
    """The line `python train.py` prints on stderr, as its only one, before it exits 1, for the error e that
    train.main() raised in-process (__main__: error_line with the rank and `alike` main() recorded; None would
    be a traceback). The scripts' own command-line handling of such an error is tested in processes of their own."""
    line = train.error_line(e, train.RUN.get("rank", 0), train.RUN.get("alike"))
    assert line and "\n" not in line, (line, e)
    return line


def records(out_dir, kind):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


# ---------------------------------------------------------------------------- the plan

def test_dry_run_plans_the_papers_135m_budget_fast(capsys):
    t = time.time()
    train.main(["--size=paper_135m", "--variant=baseline", "--target_flops=1.5e18", "--dry_run", "--data_dir=/nonexistent"])
    out = capsys.readouterr().out
    assert "759,693,312 FLOPs/token" in out
    assert out.startswith("note: /nonexistent is not prepared yet (`python prepare_data.py --source=... --out_dir=/nonexistent`); "
                          "this plan assumes vocab_size 32768, the size's\n")
    assert "-> 3,766 iterations" in out and "1.97B" in out and "tokens:params 17.9 (over the 110.1" in out
    assert "plan: 524,288 tokens/step = 16 x 2048 tokens x 16 accumulation x 1 ranks\n" in out  # the split, before a GPU job
    assert time.time() - t < 5  # a meta-device model: nothing allocated, no data read
    train.main(["--size=paper_135m", "--variant=bov", "--dry_run", "--data_dir=/nonexistent"])
    # BoV's lower FLOPs/token (745,537,536) buy more steps for the same 1.5e18 FLOPs
    out = capsys.readouterr().out
    assert f"-> {round(1.5e18 / (745_537_536 * 524_288)):,} iterations" in out and "3,838" in out


def test_dry_run_takes_the_vocabulary_the_real_run_would(data_dir, capsys):
    """The cpu size's vocabulary is the prepared data's (300 here), in the dry run as in the real run."""
    train.main([*TINY, f"--data_dir={data_dir}", "--max_iters=3", "--dry_run"])
    out = capsys.readouterr().out
    assert '"vocab_size": 300' in out and "WARNING" not in out
    # 2 warm-up steps and 2 of warmdown out of 3: no constant phase, said (6 steps: 2 + 4, step 2 at the peak); the
    # note's step 3 is the log's "step 3/3", whose lrm is 0.53
    assert "note: the warmdown (the last 2 of 3 steps) begins before the warm-up ends: the rate rises to its peak " \
           "over 2 steps, then drops to 0.53 of it at step 3, with no constant phase" in out
    assert train.lr_multiplier(2, 3, 2, 0.65, 0.05) == pytest.approx(0.525)
    train.main([*TINY, f"--data_dir={data_dir}", "--max_iters=6", "--dry_run"])
    assert "warm-up ends" not in capsys.readouterr().out
    train.main([*TINY, f"--data_dir={data_dir}", "--max_iters=3", "--final_lr_frac=1", "--dry_run"])  # no drop to tell of
    assert "warm-up ends" not in capsys.readouterr().out
    train.main([*TINY, f"--data_dir={data_dir}", "--max_iters=2", "--dry_run"])  # TINY warms up over 2 steps
    assert "WARNING: warmup_iters=2 is not below the run's 2 iterations: the whole run is warm-up" in capsys.readouterr().out
    train.main(["--dry_run", "--data_dir=/nonexistent"])  # no data: the default cpu size's own vocabulary, not the paper's
    assert capsys.readouterr().out.startswith("note: /nonexistent is not prepared yet (`python prepare_data.py --source=... "
                                              "--out_dir=/nonexistent`); this plan assumes vocab_size 4096, the size's\n")


def test_a_run_past_one_epoch_is_warned_of_in_the_dry_run_too(data_dir, capsys):
    """Any run past one epoch, not only one past two (mutant P3: the warning only past 2x)."""
    train_tokens = json.load(open(os.path.join(data_dir, "meta.json")))["train_tokens"]
    for epochs in (1, 3):
        iters = epochs * train_tokens // 128 + 1  # TINY's 128 tokens a step: just over 1 (3) epochs
        train.main([*TINY, f"--data_dir={data_dir}", f"--max_iters={iters}", "--dry_run"])
        out = capsys.readouterr().out
        assert f"WARNING: this run would read about {iters * 128 / train_tokens:.2f} epochs of {data_dir} ({train_tokens:,} train tokens)" in out
        assert f"would read about {epochs}." in out


def test_whole_numbers_are_read_in_any_notation():
    """An int setting takes 5, 5.0, 5e0 and 2e9 (a config file's 5.0 is taken too), exactly, digits past 2**53 included."""
    for text, value in (("5", 5), ("5.0", 5), ("5e0", 5), ("2e9", 2_000_000_000), ("+7", 7), ("-2", -2),
                        ("123456789012345678901", 123456789012345678901), ("9" * 400, int("9" * 400))):
        assert train._parse_value("max_iters", text, 1) == value, text


def test_true_false_settings_take_on_off_yes_no():
    """--dry_run=on / off, as a shell user writes them (mutant S1: "on" refused as not true/false)."""
    for text, value in (("on", True), ("ON", True), ("yes", True), ("1", True), ("true", True),
                        ("off", False), ("no", False), ("0", False), ("False", False)):
        assert train._parse_value("dry_run", text, False) is value, text


def test_nanogpts_names_are_answered_and_a_config_files_unknown_names_all_listed(tmp_path):
    """Each of nanoGPT's setting names gets ours; a config file's unknown names are all listed, the hint for the first."""
    for name in ("batch_size", "gradient_accumulation_steps", "learning_rate", "min_lr", "lr_decay_iters", "init_from",
                 "eval_iters", "wandb_log"):
        with pytest.raises(train.ConfigError, match=f"^unknown setting --{name}; nanoGPT's {name} is "):
            train.resolve_settings([f"--{name}=1"])
    with pytest.raises(train.ConfigError) as e:  # not read as "init_from means resume", whatever it was given
        train.resolve_settings(["--init_from=gpt2"])
    assert str(e.value) == ("unknown setting --init_from; nanoGPT's init_from is --resume here for init_from='resume' (it "
                            "continues the run in out_dir); 'scratch' is the default, and OpenAI's GPT-2 weights ('gpt2*') "
                            "do not fit this model")
    config = tmp_path / "nanogpt_style.py"
    config.write_text("learning_rate = 6e-4\nbatch_size = 12\n")
    with pytest.raises(train.ConfigError, match=f"^unknown settings learning_rate, batch_size in config file {config}; "
                                                "nanoGPT's learning_rate is matrix_lr "):
        train.resolve_settings([str(config)])


def test_a_size_without_a_recipe_is_one_line(monkeypatch):
    """A researcher's new size in model.SIZES, not yet in SIZE_DEFAULTS: told where the recipe goes, not a KeyError."""
    monkeypatch.setitem(train.SIZES, "mine", dict(train.SIZES["cpu"]))
    with pytest.raises(train.ConfigError, match=r"^size 'mine' has no recipe here; add its budget and batch to SIZE_DEFAULTS in train.py$"):
        train.resolve_settings(["--size=mine"])


def test_budget_arithmetic():
    s, _ = train.resolve_settings(["--size=paper_135m"])
    assert train.plan_iterations(s, 759_693_312) == 3766
    s, _ = train.resolve_settings(["--size=paper_780m"])
    assert s["total_batch_tokens"] == 2**20 and train.plan_iterations(s, 4_775_215_104) == 7809  # Table 6
    s, _ = train.resolve_settings(["--size=paper_135m", "--target_tokens=1e9"])
    assert s["target_flops"] == 0 and train.plan_iterations(s, 1) == round(1e9 / 524288)
    s, _ = train.resolve_settings(["--size=paper_135m", "--max_iters=10"])
    assert train.plan_iterations(s, 1) == 10


def test_a_later_config_files_budget_replaces_an_earlier_ones(tmp_path):
    """nanoGPT's habit: a small override file after a preset. Its budget wins, as any later setting does."""
    short = tmp_path / "short.py"
    short.write_text("max_iters = 20\n")
    paper = os.path.join(HERE, "config", "paper_135m.py")
    s, _ = train.resolve_settings([paper, str(short)])
    assert (s["max_iters"], s["target_flops"]) == (20, 0)
    s, _ = train.resolve_settings([str(short), paper])
    assert (s["max_iters"], s["target_flops"]) == (0, 1.5e18)
    s, _ = train.resolve_settings([paper, str(short), "--target_tokens=1e6"])  # --key=value's budget wins over files
    assert (s["max_iters"], s["target_flops"], s["target_tokens"]) == (0, 0, 1_000_000)
    short.write_text("max_iters = 20\ntarget_tokens = 1e6\n")
    with pytest.raises(train.ConfigError, match="give one budget, not target_tokens and max_iters"):
        train.resolve_settings([paper, str(short)])
    # a budget on the command line before the file, or before another flag, still wins over the file's (mutants S5:
    # the file's budget dropping the command line's, so the size's 1.5e18 comes back; S18: only the last argument read)
    for argv in (["--max_iters=5", paper], [paper, "--max_iters=5", "--seed=1"]):
        s, _ = train.resolve_settings(argv)
        assert (s["max_iters"], s["target_flops"]) == (5, 0), argv


def test_gpu_rng_states_of_a_run_with_more_gpus_restore_on_fewer(monkeypatch):
    """A checkpoint holds one CUDA RNG state per visible GPU; resuming where fewer are visible restores those."""
    import torch.cuda.random
    states, calls = train.rng_states(), []
    states["cuda"] = [torch.get_rng_state()] * 8
    def set_state(state, device="cuda"):
        if device >= 2:
            raise IndexError("tuple index out of range")  # what torch does for a device that is not there
        calls.append(device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_state)
    train.set_rng_states(states)
    assert calls == [0, 1]


def test_the_papers_data_holds_every_run_in_one_epoch():
    """prepare_data.py --source=climbmix's default train tokens hold every 135M run of the README with 5% to
    spare (the paper's regime is one epoch), and the README's --train_tokens for the 780M runs its 780M runs
    (Table 2's five rows and Tables 3 and 5's gated value embeddings) likewise. A run reads at most steps x batch
    tokens of data: the loader's padding only lowers what a row takes."""
    from model import VARIANTS
    from prepare_data import resolve_config
    import prepare_data
    config, _ = resolve_config(prepare_data.parse_args(["--source=climbmix"]))
    s, _ = train.resolve_settings(["--size=paper_135m"])
    most = max(train.plan_iterations(s, GPT.meta(GPTConfig.preset("paper_135m", v)).estimate_flops()) * s["total_batch_tokens"]
               for v in VARIANTS if builds("paper_135m", v))
    assert most == 3989 * 524288 and most * 1.05 < config["train_tokens"]  # bov_every_layer: 2.09B tokens
    readme = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")).read()
    (tokens,) = re.findall(r"--source=climbmix --train_tokens=(\S+) --force +# enough for the 780M runs", readme)
    variants = set(re.findall(r"config/paper_780m.py --variant=(\w+)", readme))
    for loop in re.findall(r"for v in ([\w ]+); do[^\n]*\n[^\n]*config/paper_780m.py --variant=\$v", readme):
        variants |= set(loop.split())
    assert variants == {"baseline", "bov", "t1_r09", "t1_r06", "t1_r03", "value_embed_gated"}  # Tables 2, 3 and 5
    s, _ = train.resolve_settings(["--size=paper_780m"])
    most = max(train.plan_iterations(s, GPT.meta(GPTConfig.preset("paper_780m", v)).estimate_flops()) * 2**20
               for v in variants)
    assert most == 8380 * 2**20 and most * 1.05 < float(tokens)  # t1_r03: 8.79B tokens


@pytest.mark.parametrize("size, rates, muon, budget", [
    # the 135M run: Table 6's rates at width 768 (no scaling), Muon's weight decay 0.28
    ("paper_135m", {"embedding": 0.30, "lm_head": 0.008, "tables": 0.15, "scalars": 0.5}, (0.02, 0.28), (1.5e18, 2**19, 16)),
    # the 780M run: its AdamW rates scaled by (1536/768)^-0.5 back to Table 6's, the scalars' to 0.7071
    ("paper_780m", {"embedding": 0.30, "lm_head": 0.008, "tables": 0.15, "scalars": 0.7071}, (0.0283, 0.0597), (3.91e19, 2**20, 4)),
])
def test_the_paper_recipes_give_table_6_rates(size, rates, muon, budget):
    s, _ = train.resolve_settings([f"--size={size}", "--variant=bov"])
    model = GPT.meta(GPTConfig.preset(size, "bov"))
    muon_opt, adamw = model.configure_optimizers(s["matrix_lr"], s["embedding_lr"], s["unembedding_lr"],
                                                 s["scalar_lr"], s["table_lr"], s["weight_decay"])
    assert {g["name"]: round(g["lr"], 4) for g in adamw.param_groups} == rates
    assert (round(muon_opt.param_groups[0]["lr"], 4), muon_opt.param_groups[0]["weight_decay"]) == muon
    assert (s["target_flops"], s["total_batch_tokens"], s["device_batch_size"]) == budget


def test_lr_schedule():
    f = lambda step: train.lr_multiplier(step, 100, 40, 0.35, 0.05)
    assert f(0) == 1 / 40 and f(39) == 1.0 and f(64) == 1.0
    assert f(65) == pytest.approx(1.0) and f(100) == pytest.approx(0.05)
    assert f(82) == pytest.approx(0.05 + 0.95 * 18 / 35)
    # a warmdown of 0.35 x 10 = 3.5 steps is 4 (Python's round, to the even neighbour, not cut to 3): step 7 is a quarter into it (mutant L1)
    assert train.lr_multiplier(7, 10, 0, 0.35, 0.05) == pytest.approx(0.7625)


# ---------------------------------------------------------------------------- the loader

def test_loader_covers_every_token_once_and_starts_rows_at_bos():
    bos, T = 0, 16
    rng = np.random.default_rng(1)
    docs = [np.concatenate([[bos], rng.integers(1, 50, size=n)]) for n in (5, 40, 3, 7, 100, 12, 9, 1, 30, 15, 2, 60)]
    shards = [np.concatenate(docs[:5]), np.concatenate(docs[5:])]
    loader = train.Batches(shards, bos, T, seed=0)
    ptr, segs = loader.plan(0)
    read, target = np.zeros(sum(map(len, shards)), dtype=int), np.zeros(sum(map(len, shards)), dtype=int)
    for r in range(len(ptr) - 1):
        row = [np.arange(s, s + n) for s, n in segs[ptr[r]:ptr[r + 1]]]
        positions = np.concatenate(row)
        assert len(positions) <= T + 1
        read[positions] += 1
        target[positions[1:]] += 1  # every position of a row but the first is predicted
        # a row starts at <|bos|> unless it continues a document; a continuation is never in the middle
        assert all(loader.read(s, 1)[0] == bos for s, _ in segs[ptr[r]:ptr[r + 1]][1:])
    # every token is read; a token is read twice only where a long document is cut (stride T rows share it)
    cuts = sum(math.ceil((len(d) - T - 1) / T) for d in docs if len(d) > T + 1)
    assert read.min() >= 1 and read.max() <= 2 and (read == 2).sum() == cuts
    # every token but <|bos|> is the target of exactly one row (a <|bos|> at most once)
    data = np.concatenate(shards)
    assert (target[data != bos] == 1).all() and target.max() == 1
    # deterministic from the seed, resumable, and reshuffled by epoch
    rows = loader.next_rows(7)
    state = loader.state()
    more = loader.next_rows(20)
    again = train.Batches(shards, bos, T, seed=0)
    assert np.array_equal(again.next_rows(7), rows)
    resumed = train.Batches(shards, bos, T, seed=0)
    resumed.load_state(state)
    assert np.array_equal(resumed.next_rows(20), more)
    assert loader.epoch >= 1 and not np.array_equal(loader.plan(1)[1], loader.plan(0)[1])


def test_the_loader_crosses_into_the_next_epoch_row_for_row():
    """next_rows() past the end of epoch 0 continues with the first row of epoch 1's plan: none skipped or repeated."""
    bos, T = 0, 16
    rng = np.random.default_rng(1)
    docs = [np.concatenate([[bos], rng.integers(1, 50, size=n)]) for n in (5, 40, 3, 7, 100, 12)]
    loader, ref = (train.Batches([np.concatenate(docs)], bos, T, seed=0) for _ in range(2))
    want = []
    for epoch in (0, 1):
        ptr, segs = ref.plan(epoch)
        want += [np.concatenate([ref.read(s, n) for s, n in segs[ptr[r]:ptr[r + 1]]]) for r in range(len(ptr) - 1)]
    got = loader.next_rows(len(want) - 3)
    assert all(np.array_equal(g[:len(w)], w) and (g[len(w):] == -1).all() for g, w in zip(got, want))
    # a resume in the second epoch goes on in it (mutant B1: load_state leaves the epoch at 0)
    resumed = train.Batches([np.concatenate(docs)], bos, T, seed=0)
    resumed.load_state(loader.state())
    assert resumed.epoch == loader.epoch == 1 and np.array_equal(resumed.next_rows(3), loader.next_rows(3))
    # a checkpoint taken right after an epoch's last row (row == rows_per_epoch, the epoch not yet advanced) resumes
    # into the next epoch's first rows (mutant: load_state refused row == rows as past the epoch, calling it damaged)
    end = train.Batches([np.concatenate(docs)], bos, T, seed=0)
    end.next_rows(end.rows_per_epoch())
    assert end.state() == {"epoch": 0, "row": end.rows_per_epoch()}
    again = train.Batches([np.concatenate(docs)], bos, T, seed=0)
    again.load_state(end.state())
    assert np.array_equal(again.next_rows(2), end.next_rows(2)) and again.epoch == end.epoch == 1
    # every epoch is shuffled anew, the third too (mutant B4: the rng seeded by min(epoch, 1))
    assert not np.array_equal(ref.plan(2)[1], ref.plan(1)[1])


def test_validation_rows_score_every_token_once():
    """Over every val shard (mutant V5: the first only), and --eval_tokens of one row is one row (V2: refused)."""
    rows = train.val_rows([np.arange(100)], 8, 64)
    assert np.array_equal(rows[:, 1:].ravel(), np.arange(1, 65))
    assert np.array_equal(train.val_rows([np.arange(40), np.arange(40, 100)], 8, 64), rows)
    assert np.array_equal(train.val_rows([np.arange(100)], 8, 8), [np.arange(9)])


def test_bits_per_byte_against_the_formula(monkeypatch):
    """A model that predicts the uniform distribution loses ln|V| nats on every token."""
    V, T = 50, 8
    model = GPT(GPTConfig.preset("cpu", "bov", n_layer=1, n_embd=16, n_head=2, vocab_size=V, block_size=T))
    torch.nn.init.zeros_(model.lm_head.weight)
    rows = np.random.default_rng(0).integers(0, V, size=(5, T + 1))
    token_bytes = np.arange(V, dtype=np.int32) % 4  # ids divisible by 4 count 0 bytes, like special tokens
    r = train.evaluate(model, rows, token_bytes, 2, torch.device("cpu"), train.nullcontext())
    targets = rows[:, 1:]
    assert r["val_loss"] == pytest.approx(math.log(V))
    expected = (targets % 4 > 0).sum() * math.log(V) / math.log(2) / token_bytes[targets].sum()
    assert r["val_bpb"] == pytest.approx(expected)
    asked = []  # on MPS, which has no float64, the sums are float32 (model.widest_float)
    monkeypatch.setattr(train, "widest_float", lambda device: asked.append(device) or torch.float32)
    r32 = train.evaluate(model, rows, token_bytes, 2, torch.device("cpu"), train.nullcontext())
    assert asked == [torch.device("cpu")] and r32["val_bpb"] == pytest.approx(expected, rel=1e-6)


# ---------------------------------------------------------------------------- training runs

def test_training_lowers_the_loss_and_logs_coefficients(data_dir, tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "run")
    os.makedirs(out)  # the metrics (and scores) of a run whose checkpoint was deleted: never replaced unasked
    old = json.dumps({"type": "eval", "step": 0, "val_bpb": 9.9}) + "\n"
    for names in (["metrics.jsonl"], ["metrics.jsonl", "core_eval.json"], ["core_eval_partial.json"],
                  ["metrics.jsonl", "core_eval.json", "core_eval_partial.json"]):
        for name in names:
            with open(os.path.join(out, name), "w") as f:
                f.write(old)
        with pytest.raises(train.ConfigError) as e:
            train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=30"])
        listed = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        assert str(e.value) == (f"{out} holds {listed} of an earlier run, but no ckpt.pt; move "
                                f"{'them' if len(names) > 1 else 'it'} away to train there, or choose another --out_dir")
        assert all(open(os.path.join(out, n)).read() == old for n in names)
        for name in names:
            os.remove(os.path.join(out, name))
    monkeypatch.chdir(os.path.dirname(data_dir))  # a relative --data_dir; the checkpoint records it absolute
    kept = []  # recorded (conftest keeps it out of the test process; test_inference tests it in processes of its own)
    monkeypatch.setattr(train, "keep_freed_memory", kept.append)
    train.main([*TINY, f"--data_dir={os.path.basename(data_dir)}", f"--out_dir={out}", "--max_iters=30",
                "--eval_interval=10", "--variant=t1_r13"])
    assert kept == ["cpu"]  # a CPU run keeps the memory a step frees for the next (sample.keep_freed_memory)
    stdout = capsys.readouterr().out
    evals = records(out, "eval")
    assert [e["step"] for e in evals] == [0, 10, 20, 30]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0
    assert set(evals[-1]["coefficients"]) == {"1"} and set(evals[-1]["coefficients"]["1"]) == {"alpha_v", "beta_v"}
    assert evals[0]["coefficients"]["1"] == {"alpha_v": 1.0, "beta_v": 0.0}
    assert evals[-1]["coefficients"]["1"]["beta_v"] != 0.0
    assert "val bpb" in stdout and "done: 30 steps" in stdout
    model, ckpt = GPT.from_checkpoint(os.path.join(out, "ckpt.pt"))
    assert ckpt["step"] == 30 and ckpt["data_dir"] == data_dir
    assert ckpt["tokenizer_sha256"] == hashlib.sha256(open(os.path.join(data_dir, "tokenizer.json"), "rb").read()).hexdigest()
    assert not [p for p in os.listdir(out) if "tmp" in p]


def test_core_eval_runs_in_the_training_dtype(data_dir, tmp_path, monkeypatch):
    """--core_eval scores CORE under the run's --dtype (it was bf16 on CUDA whatever --dtype said)."""
    from test_eval import fixture_items, write_bundle
    bundle = write_bundle(tmp_path / "b", {label: fixture_items(label, 2) for label in ev.TASKS})
    seen = []
    monkeypatch.setattr(ev, "evaluate_core", lambda *a, dtype=None, **k: (seen.append(dtype), {
        "core": 0.0, "tasks": {}, "max_per_task": None, "bundle": bundle})[1])
    for dtype in ("bfloat16", "auto"):
        train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / dtype}", "--max_iters=1", "--core_eval",
                    f"--eval_bundle={bundle}", f"--dtype={dtype}"])
    assert seen == [torch.bfloat16, torch.float32]  # auto: float32 on a CPU


def test_a_resume_with_another_validation_slice_is_warned_of(data_dir, tmp_path, capsys, monkeypatch):
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", "--max_iters=3"]
    train.main([*args, "--eval_interval=2"])  # a checkpoint at step 2, and the last at step 3
    train.main([*args, "--resume", "--eval_tokens=1024"])  # finished: no val loss follows
    assert "WARNING: eval_tokens" not in capsys.readouterr().out
    shutil.copy(tmp_path / "run" / "ckpt.pt", tmp_path / "final.pt")
    saved = torch.load(tmp_path / "final.pt", weights_only=True)
    saved["step"] = 2  # as if stopped at its step-2 checkpoint
    torch.save(saved, tmp_path / "run" / "ckpt.pt")
    train.main([*args, "--resume"])  # the same slice: no warning
    assert "WARNING: eval_tokens" not in capsys.readouterr().out
    torch.save(saved, tmp_path / "run" / "ckpt.pt")
    (tmp_path / "run" / "core_eval_partial.json").write_text("{}")  # eval.py's scores of the step-2 checkpoint
    train.main([*args, "--resume", "--eval_tokens=1024"])
    out = capsys.readouterr().out
    assert ("WARNING: eval_tokens was 2048 there and is 1024 here: val losses after step 2 may be measured on another "
            "slice than those before") in out
    assert (f"note: core_eval_partial.json in {tmp_path / 'run'} scores the checkpoint of step 2 or an earlier one, not "
            f"the one this run ends with: run eval.py again after it") in out
    train.main([*args, "--resume"])  # finished: nothing replaces the checkpoint, no note
    assert "note: core_eval" not in capsys.readouterr().out
    # with --core_eval the run rewrites core_eval.json for its last checkpoint: only eval.py's partial scores are stale
    from test_eval import fixture_items, write_bundle
    bundle = write_bundle(tmp_path / "b", {label: fixture_items(label, 2) for label in ev.TASKS})
    monkeypatch.setattr(ev, "evaluate_core", lambda *a, **k: {"core": 0.0, "tasks": {}, "max_per_task": None, "bundle": bundle})
    (tmp_path / "run" / "core_eval.json").write_text("{}")
    torch.save(saved, tmp_path / "run" / "ckpt.pt")
    train.main([*args, "--resume", "--core_eval", f"--eval_bundle={bundle}"])
    assert (f"note: core_eval_partial.json in {tmp_path / 'run'} scores the checkpoint of step 2 or an earlier one"
            in capsys.readouterr().out)
    assert json.loads((tmp_path / "run" / "core_eval.json").read_text())["step"] == 3


def test_resume_after_sigkill_is_bit_exact(data_dir, tmp_path, capsys):
    # 30 steps: the run to be killed reaches its first checkpoint (step 2) about a second before its end, and the
    # kill takes milliseconds (60 steps doubled the work of the two runs here, for a margin not needed)
    args = [*TINY, f"--data_dir={data_dir}", "--max_iters=30", "--eval_interval=2"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    # The run to be killed starts first, and a thread kills it at its first checkpoint, while the uninterrupted
    # run trains here: its torch import and the run below overlap (the kill comes as soon as before).
    proc = subprocess.Popen([sys.executable, "train.py", *args, f"--out_dir={cut}"], cwd=HERE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = os.path.join(cut, "ckpt.pt")

    def kill_at_the_first_checkpoint():
        deadline = time.time() + 120
        while not os.path.exists(ckpt) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killer = threading.Thread(target=kill_at_the_first_checkpoint, daemon=True)
    killer.start()
    try:
        train.main([*args, f"--out_dir={full}"])
    finally:
        killer.join()
    logged = lambda out: dict(re.findall(r"^step (\d+)/30 \| loss ([\d.]+)", out, re.M))  # step -> smoothed loss
    full_log = logged(capsys.readouterr().out)
    killed_at = torch.load(ckpt, weights_only=True)["step"]
    assert killed_at < 30, "the run finished before it could be killed"
    capsys.readouterr()
    train.main([*args, f"--out_dir={cut}", "--resume"])
    out = capsys.readouterr().out
    assert f"resumed {ckpt} at step {killed_at}" in out
    cut_log = logged(out)  # the console's smoothed loss goes on as if never stopped
    assert cut_log and cut_log == {k: v for k, v in full_log.items() if int(k) > killed_at}
    a = torch.load(os.path.join(full, "ckpt.pt"), weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    assert a["step"] == b["step"] == 30
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert records(full, "eval")[-1]["val_loss"] == records(cut, "eval")[-1]["val_loss"]
    assert [r["loss"] for r in records(full, "train")] == [r["loss"] for r in records(cut, "train")]


def test_two_gloo_ranks_match_one_process(data_dir, tmp_path, capsys, monkeypatch):
    """Two ranks train as one process does; with --core_eval, rank 0 evaluates CORE once the ranks have left together."""
    from test_eval import fixture_items, write_bundle
    bundle = write_bundle(tmp_path / "b", {label: fixture_items(label, 3) for label in ev.TASKS})
    # 2 accumulation steps on each rank: the gradients are synced after the last micro-batch only (mutant: the first)
    args = [*TINY, f"--data_dir={data_dir}", "--max_iters=6", "--eval_interval=3", "--total_batch_tokens=512"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    # its own process group, so that a hung rank can be killed with torchrun; started first, so that its
    # three torch imports overlap the one-process run here
    # train.py under a spy that saves each rank's first gradient, after DDP's averaging (mutant: the loss not scaled
    # by the number of ranks, which the optimizers' normalised updates all but hide from the losses)
    spied = tmp_path / "spied_train.py"
    spied.write_text(f"import runpy, sys\nsys.path.insert(0, {HERE!r})\nfrom conftest import first_gradient_spy\n"
                     f"from model import GPT\nGPT.configure_optimizers = first_gradient_spy({str(tmp_path / 'g_two')!r})\n"
                     f"sys.argv[0] = {os.path.join(HERE, 'train.py')!r}\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(spied), *args, f"--out_dir={two}", "--core_eval", f"--eval_bundle={bundle}"],
                            cwd=HERE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        monkeypatch.setattr(GPT, "configure_optimizers", first_gradient_spy(tmp_path / "g_one"))
        train.main([*args, f"--out_dir={one}"])
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert "4 x 32 tokens x 4 accumulation x 1 ranks" in capsys.readouterr().out
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("torchrun with 2 gloo ranks did not finish in 120 s")
    assert proc.returncode == 0, stderr[-2000:]
    assert "4 x 32 tokens x 2 accumulation x 2 ranks" in stdout
    # tok/s is the step's 512 tokens over all ranks per second, not that x the ranks (mutant T16: x world, and the MFU with it)
    steps = [(int(ms), int(rate.replace(",", "")))
             for ms, rate in re.findall(r"^step \d+/6 .*\| dt (\d+) ms \| tok/s ([\d,]+)", stdout, re.M)]
    assert len(steps) == 6 and all(rate == pytest.approx(512 / (ms / 1000), rel=0.15) for ms, rate in steps if ms >= 5), steps
    g1, g2 = torch.load(tmp_path / "g_one.0"), [torch.load(tmp_path / f"g_two.{rank}") for rank in (0, 1)]
    assert torch.equal(g2[0], g2[1]) and ((g2[0] - g1).norm() / g1.norm()).item() < 1e-5  # the same token mean
    l1, l2 = [r["loss"] for r in records(one, "train")], [r["loss"] for r in records(two, "train")]
    assert len(l1) == len(l2) == 6
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    np.testing.assert_allclose(records(one, "eval")[-1]["val_loss"], records(two, "eval")[-1]["val_loss"], rtol=1e-5)
    core = json.loads((tmp_path / "two" / "core_eval.json").read_text())
    assert len(core["tasks"]) == 21 and core["ckpt"] == os.path.join(two, "ckpt.pt") and stdout.count("CORE ") == 1


# ---------------------------------------------------------------------------- bad input

def test_under_torchrun_a_refusal_is_one_line_from_rank_0(data_dir, tmp_path):
    """Every rank meets the same bad setting: one line, not one per rank. A check rank 0 alone makes (the
    out_dir's lock): the other rank stops quietly too, not with a traceback from its next collective."""
    from prepare_data import lock_folder
    busy = tmp_path / "busy"
    busy.mkdir()
    lock = lock_folder(str(busy), True, "held by the test")

    def torchrun(*args):
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
                                 *TINY, f"--data_dir={data_dir}", "--max_iters=2", *args], cwd=HERE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    runs = [torchrun(f"--out_dir={busy}", "--total_batch_tokens=256"), torchrun(f"--out_dir={tmp_path / 'odd'}", "--warmdown_frac=2")]
    try:
        errors = [[l for l in finish(p, 120).stderr.splitlines() if l.startswith(("error", "rank", "[rank"))] for p in runs]
    finally:
        for p in runs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        lock.close()
    assert errors == [[f"error: another train.py is writing {busy}; wait for it to end, or choose another --out_dir"],
                      ["error: --warmdown_frac is a fraction: 0 to 1, got 2.0"]]
    assert os.listdir(busy) == [".lock"] and not (tmp_path / "odd").exists()


def test_each_rank_reports_what_is_its_own(monkeypatch):
    """Rank 0 reports an error every rank meets alike, and a lost peer; another rank stays quiet about those and
    reports its own failures, named; a torch.distributed error that is not a lost peer keeps its message."""
    monkeypatch.setattr(train, "RUN", {"ckpt": None})
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:33189: Connection "
                        "reset by peer. This is typically caused by a remote worker hanging")
    port = torch.distributed.DistNetworkError("The server socket has failed to listen on any local network address. "
                                              "port: 29633, useIpv6: false, code: -98, name: EADDRINUSE")
    assert train.peer_lost(gloo) and not train.peer_lost(port)
    assert not train.peer_lost(RuntimeError("CUDA error: an illegal memory access")) and not train.peer_lost(OSError("gloo by peer"))
    bad = train.ConfigError("--max_iters must be positive, got 0")
    assert train.error_line(bad, 0, True) == train.error_line(bad, 0, False) == "error: --max_iters must be positive, got 0"
    assert train.error_line(bad, 1, True) == ""  # met by every rank: rank 0 said it
    assert train.error_line(bad, 1, False) == "rank 1: error: --max_iters must be positive, got 0"  # e.g. its own GPU
    assert train.error_line(train.PeerStopped(), 1, False) == "" and train.error_line(gloo, 1, False) == ""
    assert train.error_line(gloo, 0, False) == ("error: another rank left the run (its line is above, or in torchrun's "
                                                 "report); no checkpoint was written yet")
    assert train.error_line(port, 0, True) is None and train.error_line(KeyError("x"), 2, False) is None  # tracebacks
    assert train.error_line(MemoryError("Unable to allocate 64.0 GiB"), 1, True).startswith("rank 1: error: out of memory (")
    import torch._dynamo.exc as dynamo_exc  # no C++ compiler: every rank fails alike
    no_compiler = dynamo_exc.TorchDynamoException("CppCompileError: C++ compile error")
    assert train.error_line(no_compiler, 0, True).startswith("error: torch.compile failed (") and train.error_line(no_compiler, 1, True) == ""
    for other in (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:446] Timed out waiting 1800000ms for recv"),
                  RuntimeError("Connection reset by peer")):  # gloo, but no lost peer; a lost peer, but not gloo's
        assert not train.peer_lost(other)
    compiled = RuntimeError("backend compiler failed")  # torch.compile wraps the allocator's error
    compiled.__cause__ = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert train.error_line(compiled, 0, True).startswith("error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)")


def test_rank_0s_own_check_is_agreed_on_by_every_rank(monkeypatch):
    """on_rank0 under torchrun: rank 0 runs the check and broadcasts whether it failed; another rank never
    runs it, and stops (PeerStopped) when rank 0 failed."""
    sent, ran = [], []

    def broadcast(objects, src):  # what rank 0 sends; on rank 1, what it receives
        assert src == 0
        sent.append(list(objects))
        objects[0] = broadcast.rank0_failed
    monkeypatch.setattr(train.dist, "broadcast_object_list", broadcast)
    broadcast.rank0_failed = True
    with pytest.raises(train.PeerStopped):
        train.on_rank0(True, False, lambda: ran.append(1))
    broadcast.rank0_failed = False
    assert train.on_rank0(True, False, lambda: ran.append(1)) is None and ran == []  # rank 1 never runs it
    with pytest.raises(train.ConfigError, match="^busy$"):
        train.on_rank0(True, True, lambda: (_ for _ in ()).throw(train.ConfigError("busy")))
    assert train.on_rank0(True, True, lambda: "bundle") == "bundle"
    assert sent == [[False], [False], [True], [False]]  # rank 0 told the others of its failure, and of its success


def test_which_errors_every_rank_meets_alike(monkeypatch):
    """On one machine (LOCAL_WORLD_SIZE = WORLD_SIZE, or neither set) every rank reads the same files; on several
    it may not, and each rank reports its own errors."""
    for local, world, alike in (("8", "16", False), ("8", "8", True), (None, None, True)):
        for k, v in (("LOCAL_WORLD_SIZE", local), ("WORLD_SIZE", world)):
            if v is None:
                monkeypatch.delenv(k, raising=False)
            else:
                monkeypatch.setenv(k, v)
        with pytest.raises(train.ConfigError):
            train.main(["--warmdown_frac=2"])
        assert train.RUN["alike"] is alike, (local, world)


def test_mfu_divides_by_the_gpus_own_dense_bf16_peak():
    """The names torch.cuda.get_device_name() gives: a PCIe or NVL part is not taken for the SXM one."""
    for name, peak in (("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
                       ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                       ("NVIDIA GeForce RTX 4090", None)):
        assert train.peak_flops(name) == peak, name
    # 8 H100s at 524,288 tokens/s of a 759.7 MFLOPs/token model: 398 TFLOP/s in all, 5.0% of 8 x 989 TFLOP/s
    assert round(train.mfu(759_693_312, 524_288, 989e12, 8), 3) == 5.034


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # torch.autocast("cuda") on a CPU build: the test needs none
def test_mfu_is_against_the_bf16_peak_so_only_for_bf16_training(monkeypatch):
    """On a listed GPU a bf16 run gets its peak for MFU and says how it runs; a float32 run (TF32 matmuls, another
    peak) gets none, rather than an MFU against the bf16 peak."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    precision = torch.get_float32_matmul_precision()  # training_model sets TF32 for CUDA: put back for the next tests
    model = GPT(GPTConfig.preset("cpu", "bov", n_layer=2, n_embd=32, n_head=2, vocab_size=64, block_size=16))
    try:
        got = {d: train.training_model({"dtype": d, "compile": "false"}, model, torch.device("cuda:0"), False)[2:]
               for d in ("auto", "bfloat16", "float32")}
    finally:
        torch.set_float32_matmul_precision(precision)
    assert got == {"auto": (989e12, "device: cuda:0 (NVIDIA H100 80GB HBM3), bfloat16 autocast, eager"),
                   "bfloat16": (989e12, "device: cuda:0 (NVIDIA H100 80GB HBM3), bfloat16 autocast, eager"),
                   "float32": (None, "device: cuda:0 (NVIDIA H100 80GB HBM3), float32, eager")}


def test_dtype_sets_the_autocast_of_training(data_dir, monkeypatch):
    """--dtype auto is bf16 on a GPU with bf16 in hardware (asked of the run's own GPU: an H100 beside a V100 here) and
    fp32 (no autocast) elsewhere: a V100 only emulates bf16, and there is no fp16 training; the training model's
    autocast follows it."""
    capability = {0: (9, 0), 1: (7, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability[torch.device(d).index or 0])
    monkeypatch.setattr(torch.version, "hip", None)
    got = {d: train.autocast_dtype({"dtype": "auto"}, torch.device(d)) for d in ("cuda", "cuda:0", "cuda:1", "cpu", "mps")}
    assert got == {"cuda": torch.bfloat16, "cuda:0": torch.bfloat16, "cuda:1": torch.float32, "cpu": torch.float32,
                   "mps": torch.float32}
    monkeypatch.setattr(torch.version, "hip", "6.4")  # ROCm: bf16 on every GPU it runs
    assert train.autocast_dtype({"dtype": "auto"}, torch.device("cuda:1")) == torch.bfloat16
    assert train.autocast_dtype({"dtype": "bfloat16"}, torch.device("cuda:1")) == torch.bfloat16  # asked for: as asked
    model = GPT(GPTConfig.preset("cpu", "bov", n_layer=2, n_embd=32, n_head=2, vocab_size=64, block_size=16))
    for dtype, enabled in (("bfloat16", True), ("float32", False), ("auto", False)):
        _, autocast, _, line = train.training_model({"dtype": dtype, "compile": "false"}, model, torch.device("cpu"), False)
        assert line == f"device: cpu, {'bfloat16 autocast' if enabled else 'float32'}, eager"
        with autocast:
            assert torch.is_autocast_enabled("cpu") == enabled
            assert not enabled or torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert train.on_rank0(False, True, lambda: 7) == 7  # one process: fn runs, its error is raised as it is
    with pytest.raises(train.ConfigError, match="^no$"):
        train.on_rank0(False, True, lambda: (_ for _ in ()).throw(train.ConfigError("no")))


def test_bad_input_gives_one_clear_line(data_dir, tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "run")
    base = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2"]

    def error(args):
        with pytest.raises((train.ConfigError, train.DataError)) as e:
            train.main(args)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert error([*base, "--n_layers=3"]) == "unknown setting --n_layers; did you mean --n_layer or --bov_layers?"
    assert error([*base, "--batch_size=4"]).startswith("unknown setting --batch_size; nanoGPT's batch_size is device_batch_size")
    assert error([*base, "--grad_clip=1.0"]).startswith("unknown setting --grad_clip; nanoGPT's grad_clip is not here: no clipping")
    assert "nanoGPT's dropout is not in this model" in error([*base, "--dropout=0.1"])
    assert error([*base, "--zzz=1"]).startswith("unknown setting --zzz; settings are: size, variant, data_dir,")
    (tmp_path / "typo.py").write_text("max_iter = 3\n")
    assert error([str(tmp_path / "typo.py"), *base]) == f"unknown setting max_iter in config file {tmp_path / 'typo.py'}; did you mean max_iters?"
    assert "unknown variant" in error([*base, "--variant=bovv"])
    assert "give one budget" in error([*base, "--target_flops=1e12"])
    assert "no prepared data" in error([*TINY, "--data_dir=/nonexistent", "--max_iters=2"])
    for dry in ([], ["--dry_run"]):
        assert error([*TINY, f"--data_dir={data_dir}/meta.json", "--max_iters=2", *dry]) == (
            f"{data_dir}/meta.json is a file; the data is a folder that prepare_data.py writes (--data_dir)")
    nested = tmp_path / "new" / "deep" / "run"  # a folder that a failed run made goes again, parents included
    assert "--resume: no checkpoint" in error([*TINY, f"--data_dir={data_dir}", f"--out_dir={nested}", "--max_iters=2", "--resume"])
    assert not (tmp_path / "new").exists()
    assert "larger than the data's uint16" in error([*base, "--vocab_size=70000"])
    assert "smaller than the data's vocabulary (" in error([*base, "--vocab_size=100"])
    assert error([*base, "--vocab_size=100", "--dry_run"]) == error([*base, "--vocab_size=100"])  # the plan checks it too
    assert error([*base, "--vocab_size=70000", "--dry_run"]) == error([*base, "--vocab_size=70000"]) == \
        "vocab_size 70000 is larger than the data's uint16 ids can hold"
    assert error([*base, "--variant=svformer", "--bov_layers=0,1"]) == ("bad GPTConfig: value_source 'v1' with layer 0 as a "
        "target: layer 0 produces V1 and cannot also consume it (size cpu, variant svformer)")  # the list says it already
    assert error([*base, "--variant=t1_r06", "--n_layer=1"]) == (  # the variant's own layers, at a depth where they
        "bad GPTConfig: value_source 'v1' with layer 0 as a target (bov_layers='last_third' at n_layer=1 gives [0]): "  # are 0
        "layer 0 produces V1 and cannot also consume it (size cpu, variant t1_r06)")
    assert "bov_layers must be 'last_third', 'every_other', 'all', 'none' or a list of layer indices, got 'last_2'" \
        in error([*base, "--bov_layers=last_2"])
    assert "--variant=baseline has no target layers; --bov_layers would train a value variant under its name" \
        in error([*base, "--variant=baseline", "--bov_layers=1"])
    assert error([*base, "--variant=bov", "--bov_layers=none"]) == (
        "--variant=bov has no target layers here (bov_layers='none' at n_layer=2), so it is standard attention under a "
        "value variant's name: train it as --variant=baseline")
    # what a target layer computes is the variant's own: another grid cell is another variant (the nearest named)
    assert error([*base, "--variant=bov", "--value_source=x0"]) == error([*base, "--variant=bov", "--value_source=x0", "--dry_run"]) == (
        "--value_source=x0 would train another value variant under bov's name; it is --variant=t1_r09 (a variant's "
        "target layers may move with --bov_layers)")
    assert error([*base, "--variant=baseline", "--shared_table=true"]).startswith(
        "--shared_table=True would train another value variant under baseline's name; it is --variant=bov_shared_table")
    assert "--value_mix=add would train another value variant under bov's name; it is --variant=bov_keep_v" in error(
        [*base, "--variant=bov", "--value_mix=add", "--bov_layers=1"])
    assert error([*base, "--variant=bov", "--value_source=x0", "--bov_layers=every_other"]).endswith("it is --variant=t1_r07 "
        "(a variant's target layers may move with --bov_layers)")
    assert error([*base, "--variant=bov_keep_v", "--value_coeff=fixed"]).startswith(
        "--value_coeff=fixed would train another value variant under bov_keep_v's name; add it to VARIANTS in model.py")
    assert error([*base, "--variant=svformer", "--n_layer=1"]).startswith(  # "all" from layer 1: none at one layer
        "--variant=svformer has no target layers here (bov_layers='all' at n_layer=1), so it is standard attention")
    assert "--device_batch_size must be positive" in error([*base, "--device_batch_size=0"])
    assert "--dtype must be one of" in error([*base, "--dtype=fp8"])
    assert "--compile must be one of" in error([*base, "--compile=maybe"])
    assert error([*base, "--device=foo"]) == error([*base, "--device=foo", "--dry_run"]) == (
        "--device foo is not usable here: not a device type torch knows (cpu, cuda, cuda:N, mps, ...)")
    assert "less than one row of block_size=32" in error([*base, "--eval_tokens=10"])
    assert "less than one row of block_size=32" in error([*base, "--eval_tokens=10", "--dry_run"])  # the plan says it
    assert "= 4 x 32 x 1; e.g. --device_batch_size=3" in error([*base, "--total_batch_tokens=96"])
    assert "; give a multiple of 32" in error([*base, "--total_batch_tokens=100"])
    assert f"--out_dir {data_dir}/ is the data folder" in error([*TINY, f"--data_dir={data_dir}", f"--out_dir={data_dir}/", "--max_iters=2"])
    bad_file = tmp_path / "bad_config.py"
    bad_file.write_text("size = 'cpu\n")
    assert f"config file {bad_file}: SyntaxError" in error([str(bad_file), *base])
    assert f"config file {tmp_path} is a folder" == error([str(tmp_path), *base])
    train.main(base)
    ckpt = os.path.join(out, "ckpt.pt")
    before = open(ckpt, "rb").read()
    # on the command line a damaged checkpoint is one line on stderr, no traceback: checked on a copy of the
    # run with the checkpoint truncated, started now so that its torch import overlaps the checks below
    cli_out = tmp_path / "cli_run"
    shutil.copytree(out, cli_out)
    (cli_out / "ckpt.pt").write_bytes(before[:len(before) // 2])
    cli_base = [*base[:-2], f"--out_dir={cli_out}", "--max_iters=2", "--resume"]
    cli = start_train(cli_base)
    assert "pass --resume" in error(base)                                   # never overwrite a run
    assert error([*base, "--resume", "--n_layer=3"]) == (  # another config: said as the flags that give the checkpoint's
        f"--resume: {ckpt} is a different model (n_layer=2 there, 3 here); use the same settings (--n_layer=2) or another --out_dir")
    assert error([*base, "--resume", "--bov_layers=1,0"]) == (  # a layer list as typed, not as Python's tuple (1, 0)
        f"--resume: {ckpt} is a different model (bov_layers=last_third there, 1,0 here); use the same settings "
        f"(--bov_layers=last_third) or another --out_dir")
    assert error([*base, "--resume", "--variant=baseline"]) == (f"--resume: {ckpt} is a --size=cpu --variant=bov run, this "
                                                               f"one --size=cpu --variant=baseline; use the same, or another --out_dir")
    assert error([*base, "--resume", "--size=paper_135m"]) == (  # the same model (the flags set it), another recipe
        f"--resume: {ckpt} is a --size=cpu --variant=bov run, this one --size=paper_135m --variant=bov; use the same, or "
        f"another --out_dir")
    renamed = torch.load(io.BytesIO(before), weights_only=True)  # the same model under another preset's name (baseline
    renamed["train_config"]["variant"] = "t1_r02"                   # and t1_r01, say) resumes: the model decides
    torch.save(renamed, ckpt)
    train.main([*base, "--resume"])  # (finished already: no step)
    older = torch.load(io.BytesIO(before), weights_only=True)  # written before a model field existed: its default
    del older["model_config"]["shared_table"]                    # (False) is this run's, so it resumes, as sample.py
    torch.save(older, ckpt)                                      # reads it (the advice was "use the same settings ()")
    train.main([*base, "--resume"])
    older["model_config"]["bogus"] = 1  # a field this code does not have
    torch.save(older, ckpt)
    assert error([*base, "--resume"]) == (f"--resume: {ckpt} names model settings this code does not have (bogus): a "
                                          f"checkpoint of another version of model.py; use that version, or another --out_dir")
    open(ckpt, "wb").write(before)
    capsys.readouterr()
    with monkeypatch.context() as m:  # refused before the data is loaded or the model built (a 780M takes a while)
        m.setattr(train, "load_data", None)  # (it comes before the model)
        assert error([*base, "--resume", "--seed=4"]).endswith("other settings (seed=3 there, 4 here); use the same ones (--seed=3)")
        assert error(base).endswith("exists; pass --resume to continue that run, or choose another --out_dir")
    assert "\ndata: " not in capsys.readouterr().out
    assert error([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--target_flops=1e7", "--resume"]).endswith(
        "other settings (target_flops=0 there, 1e+07 here, max_iters=2 there, 0 here); use the same ones (--max_iters=2) "
        "(the learning-rate schedule is planned from the budget, so a run cannot be lengthened)")  # flags to paste
    assert "matrix_lr=0.02 there, 0.03 here" in error([*base, "--resume", "--matrix_lr=0.03"])
    assert "matrix_lr=0.02 there, 0.0123456789 here); use the same ones (--matrix_lr=0.02)" in error(
        [*base, "--resume", "--matrix_lr=0.0123456789"])  # every digit where 6 would not give the number back
    assert open(ckpt, "rb").read() == before
    open(ckpt, "wb").write(before[:len(before) // 2])                       # truncated
    assert error([*base, "--resume"]) == (f"--resume: cannot read checkpoint {ckpt}: not a checkpoint train.py wrote, "
                                          f"or damaged (not a complete zip archive)")
    open(ckpt, "wb").write(before)
    record = flip_tensor_byte(Path(ckpt))                                   # one bit changed since the save
    assert error([*base, "--resume"]).endswith(f"damaged (its record {record} fails the zip's CRC-32 or header check)")
    open(ckpt, "wb").write(before)
    damaged = torch.load(ckpt, weights_only=True)
    del damaged["model"]["wte.weight"]
    torch.save(damaged, ckpt)
    with monkeypatch.context() as m:  # also found before the data is loaded
        m.setattr(train, "load_data", None)
        assert error([*base, "--resume"]) == f"--resume: {ckpt} is damaged (its weights do not fit the model it names: wte.weight)"
        damaged["model"]["wte.weight"] = torch.zeros(300, 31)
        damaged["model"]["lm_head.weight"] = 0.5
        torch.save(damaged, ckpt)
        assert error([*base, "--resume"]).endswith("(its weights do not fit the model it names: wte.weight, lm_head.weight)")
        damaged["model"][0] = torch.zeros(1)  # a key that is not a name: still one line
        torch.save(damaged, ckpt)
        assert error([*base, "--resume"]).endswith("(its weights do not fit the model it names: 0, wte.weight, lm_head.weight)")
    other_dtype = torch.load(io.BytesIO(before), weights_only=True)  # weights in another float dtype: the load converts
    other_dtype["model"] = {k: v.double() for k, v in other_dtype["model"].items()}
    torch.save(other_dtype, ckpt)
    train.main([*base, "--resume"])  # (finished already: no step)
    open(ckpt, "wb").write(before)
    damaged = torch.load(ckpt, weights_only=True)  # what only the load finds: an optimizer's state
    damaged["optimizers"][0]["param_groups"] = []
    torch.save(damaged, ckpt)
    assert f"--resume: {ckpt} is damaged (ValueError" in error([*base, "--resume"])
    good = torch.load(io.BytesIO(before), weights_only=True)  # other things torch can save, or edited entries
    for saved, expected in [(5, "is not a train.py checkpoint (it holds 'int', not a dict)"),
                            (torch.zeros(3), "is not a train.py checkpoint (it holds 'Tensor', not a dict)"),
                            ({**good, "model_config": None}, "is damaged ('model_config' is a NoneType, not a dict)"),
                            ({**good, "train_config": [1]}, "is damaged ('train_config' is a list, not a dict)"),
                            ({**good, "metrics": [{"x": 1}]}, "is damaged (its metrics are not train.py's records)"),
                            ({**good, "smooth_loss": "4.2"}, "is damaged ('smooth_loss' is a str, not a float)"),
                            ({**good, "data_counts": [1]}, "is damaged ('data_counts' is a list, not a dict)"),
                            *[({k: v for k, v in good.items() if k != key}, f"is not a checkpoint of this train.py (no {key!r})")
                              for key in ("tokenizer_sha256", "data_dir", "data_counts", "smooth_loss")]]:
        torch.save(saved, ckpt)
        assert f"--resume: {ckpt} {expected}" == error([*base, "--resume"])
    before_table_lr = {k: v for k, v in good["train_config"].items() if k != "table_lr"}  # a checkpoint from before a setting
    torch.save({**good, "train_config": before_table_lr}, ckpt)
    refusal = error([*base, "--resume"])  # what the run used before the setting existed is not known: refused
    assert refusal.startswith(f"--resume: {ckpt} was trained with other settings (table_lr=None there, ")
    assert refusal.endswith("there, 0.15 here): table_lr not recorded there, the checkpoint predates the setting, so this code cannot resume it")
    # the data folder is compared as a folder: the same data by another path resumes, other data does not
    open(ckpt, "wb").write(before)
    link = tmp_path / "same_data"
    os.symlink(data_dir, link)
    train.main([*base[:-1], "--resume", f"--data_dir={link}", "--max_iters=2"])  # finished already: no step, no error
    other = tmp_path / "other_data"  # other data: here a copy whose tokenizer differs
    shutil.copytree(data_dir, other)
    with open(other / "tokenizer.json", "a") as f:
        f.write(" ")
    assert f"was trained on the data in {data_dir}, this run reads {other}" in error(
        [*base[:-1], "--resume", f"--data_dir={other}", "--max_iters=2"])
    # other data of another vocabulary makes another model too: the data is named, as what to change
    assert f"was trained on the data in {data_dir}, this run reads {other}" in error(
        [*base[:-1], "--resume", f"--data_dir={other}", "--max_iters=2", "--vocab_size=5000"])
    moved = tmp_path / "moved_data"  # the same data in another folder: the tokenizer and the counts say so
    shutil.copytree(data_dir, moved)
    train.main([*base[:-1], "--resume", f"--data_dir={moved}", "--max_iters=2"])
    rebuilt = torch.load(ckpt, weights_only=True)  # the same folder and tokenizer, other data (another --train_tokens)
    rebuilt["data_counts"] = dict(rebuilt["data_counts"], train_tokens=5)
    torch.save(rebuilt, ckpt)
    assert error([*base[:-1], "--resume", "--max_iters=2"]) == (
        f"--resume: the data in {data_dir} is not the data {ckpt} was trained on (train_tokens 5 there, "
        f"{load_meta(data_dir)['train_tokens']} here: it was prepared again); resume needs the same data")
    open(ckpt, "wb").write(before)
    rebuilt = torch.load(ckpt, weights_only=True)  # the same folder, prepared again with another tokenizer
    rebuilt["tokenizer_sha256"] = "0" * 64
    torch.save(rebuilt, ckpt)
    assert f"the tokenizer in {data_dir} is not the one {ckpt} was trained with" in error(
        [*base[:-1], "--resume", "--max_iters=2"])
    r = finish(cli)  # the truncated copy, on the command line: the one line of the in-process error
    expected = error(cli_base)
    assert expected.endswith("or damaged (not a complete zip archive)")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"error: {expected}"]


def test_bad_numbers_and_config_values_are_refused(data_dir, tmp_path, monkeypatch, capsys):
    base = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", "--max_iters=2"]
    # The command-line run below starts now, with its own --out_dir: its torch import and the failing compile
    # overlap the in-process checks; it is collected where it was run.
    no_compiler = {**os.environ, "CXX": "/nonexistent/g++", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # no cache hit
    compiled = start_train([*base, f"--out_dir={tmp_path / 'compiled'}", "--compile=true", "--n_layer=1"],  # one layer:
                           env=no_compiler)  # the same failure at the first compiled step, with less to trace first

    def error(args):
        with pytest.raises(train.ConfigError) as e:
            train.main(args)
        assert "\n" not in str(e.value)
        return str(e.value)

    for flag, expected in (("--target_flops=nan", "--target_flops must be positive, got nan"),
                           ("--matrix_lr=inf", "--matrix_lr must be a finite number"),
                           ("--weight_decay=-1", "--weight_decay must not be negative"),
                           ("--embedding_lr=-0.1", "--embedding_lr must not be negative"),
                           ("--seed=-1", "--seed must not be negative"),
                           ("--final_lr_frac=50", "--final_lr_frac is a fraction: 0 to 1, got 50"),
                           ("--warmdown_frac=nan", "--warmdown_frac must be a finite number"),
                           ("--target_tokens=1e400", "--target_tokens: expected a whole number, got '1e400'"),
                           ("--max_iters=2.5", "--max_iters: expected a whole number, got '2.5'"),
                           ("--max_iters=abc", "--max_iters: expected a whole number, got 'abc'"),
                           ("--eval_bundle=/x", "--eval_bundle is read by --core_eval only"),
                           ("--device=meta", "--device=meta holds no data"),
                           ("--max_iters=2.5e0", "--max_iters: expected a whole number, got '2.5e0'"),
                           ("--seed=4294967296", "--seed must be below 2^32"),
                           ("--n_layer", "--n_layer needs a value: --n_layer=VALUE"),   # not "--n_layer 3"
                           ("--dry_run=", "--dry_run: expected true/false, got ''"),  # not read as true
                           ("--data_dir=", "--data_dir is empty; give the prepared-data folder (default data/shakespeare)"),
                           ("max_iters=5", "config file max_iters=5 not found; did you mean --max_iters=5?"),
                           ("-max_iters=5", "config file -max_iters=5 not found; did you mean --max_iters=5?"),
                           ("--device=xla", "--device xla is not usable here: this torch build has no xla backend")):
        assert expected in error([*base, flag]), flag
    assert "--max_iters must be positive, got 0" in error([*TINY, f"--data_dir={data_dir}", "--max_iters=0"])
    config = tmp_path / "c.py"
    for line, expected in (("max_iters = 2.5", "max_iters = 2.5 in config file"), ('dry_run = "false"', "expected bool"),
                           ("seed = None", "expected int"), ('size = ["cpu"]', "expected str")):
        config.write_text(line + "\n")
        assert expected in error([str(config), *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}"]), line
    config.write_text('n_layer = "six"\n')  # no default quoted: GPTConfig's 12 is not the cpu size's 6
    assert error([str(config), *TINY, f"--data_dir={data_dir}"]) == f"n_layer = 'six' in config file {config}: expected int"
    config.write_text("import math\nmax_iters = math.floor(2.5)\n")  # a module is not a setting
    assert train.resolve_settings([str(config), *TINY, f"--data_dir={data_dir}"])[0]["max_iters"] == 2
    (tmp_path / "afile").write_text("")
    assert "is a file, not a folder" in error([*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'afile'}", "--max_iters=2"])
    assert "cannot be made: Not a directory" in error([*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'afile' / 'x'}",
                                                       "--max_iters=2"])
    assert not (tmp_path / "run").exists()  # nothing was started
    with pytest.raises(train.ConfigError, match="not a multiple of"):  # the dry run checks the batch split too
        train.main(["--size=paper_135m", "--total_batch_tokens=1000", "--dry_run"])
    # a budget on the command line replaces a config file's; a config file may say compile = False
    config.write_text("target_flops = 1e18\ncompile = False\n")
    s, _ = train.resolve_settings([str(config), "--max_iters=5"])
    assert (s["max_iters"], s["target_flops"], s["compile"]) == (5, 0.0, "false")
    from eval import EvalError
    bundle_out = tmp_path / "bundle_first"  # the bundle before training: the one line `python train.py` prints
    capsys.readouterr()
    with pytest.raises(EvalError) as e:
        train.main([*base, f"--out_dir={bundle_out}", "--core_eval", f"--eval_bundle={tmp_path / 'nowhere'}"])
    assert cli_error_line(e.value) == (f"error: --eval_bundle: no folder {tmp_path / 'nowhere'}; expected an unzipped "
                                       "eval_bundle (eval_meta_data.csv and eval_data/)")
    out, err = capsys.readouterr()
    assert err == "" and "step 1/" not in out and not (bundle_out / "ckpt.pt").exists()
    from test_eval import closed_port_url  # no bundle and no network: the hint names train.py's own setting
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BOV_EVAL_BUNDLE_URL", closed_port_url())
    with pytest.raises(EvalError, match=r"is unreachable; .* pass --eval_bundle path/to/eval_bundle$"):
        train.main([*base, "--core_eval"])
    partial = tmp_path / "partial_bundle"  # a bundle that lacks tasks: found before training too
    (partial / "eval_data").mkdir(parents=True)
    (partial / "eval_meta_data.csv").write_text("Eval Task,Random baseline\ncopa,50\n")
    with pytest.raises(EvalError, match=f"^{partial}/eval_meta_data.csv has no random baseline for jeopardy, "):
        train.main([*base, "--core_eval", f"--eval_bundle={partial}"])
    assert not (tmp_path / "run" / "ckpt.pt").exists()
    # a batch no machine holds (2^40 rows: more than any address space, so no overcommit lets it through)
    capsys.readouterr()
    with pytest.raises(MemoryError) as e:
        train.main([*base, f"--out_dir={tmp_path / 'huge'}", "--device_batch_size=1099511627776",
                    "--total_batch_tokens=35184372088832", "--max_iters=1"])
    line = cli_error_line(e.value)
    assert line.startswith("error: out of memory (") and "lower --device_batch_size" in line
    assert "--total_batch_tokens (a step's rows are read at once)" in line and capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="Maximum allowed dimension exceeded") as e:  # past numpy's sizes: out of memory too
        train.main([*base, f"--out_dir={tmp_path / 'huge2'}", "--total_batch_tokens=1e30", "--max_iters=1"])
    assert train.out_of_memory(e.value)
    r = finish(compiled)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: torch.compile failed (InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx: "
        "(None, '/nonexistent/g++')); run with --compile=false"]
    assert train.out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not train.out_of_memory(RuntimeError("shape mismatch"))


def test_ctrl_c_and_sigterm_are_not_tracebacks(data_dir, tmp_path):
    # (--help, once checked here too: test_the_scripts_leave_ignored_signals_ignored)
    # both runs start together (their torch imports overlap); a thread per run sends its signal once the run
    # logs step 3, as soon as it would alone: SIGTERM (kill, Slurm) to the first, Ctrl-C to the second
    runs = [start_train([*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / name}", "--max_iters=100000",
                         f"--eval_interval={interval}"]) for name, interval in (("run", 100000), ("run2", 2))]

    def signal_at_step_3(p, sig):
        for line in p.stdout:
            if line.startswith("step 3/"):  # in run2, after the checkpoint of step 2
                break
        p.send_signal(sig)
        p.send_signal(sig)  # twice, as Slurm and torchrun both send one: harmless here (the two usually arrive as one;
        # test_a_second_stop_signal_does_not_cut_the_cleanup_short is the deterministic check)
    threads = [threading.Thread(target=signal_at_step_3, args=(p, sig), daemon=True)
               for p, sig in zip(runs, (signal.SIGTERM, signal.SIGINT))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(timeout=120)
            assert not t.is_alive(), "a run never logged step 3"
        r = finish(runs[0], 60)
        assert r.returncode == 143 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines() == ["terminated (SIGTERM); no checkpoint was written yet (the first comes at step 100000)"]
        assert not (tmp_path / "run").exists()  # nothing was saved: no folder, no empty metrics.jsonl for --plot to trip on
        r = finish(runs[1], 60)
        ckpt = tmp_path / "run2" / "ckpt.pt"
        assert r.returncode == 130 and r.stderr.strip().splitlines() == [f"interrupted; {ckpt}, from the last evaluation, continues with --resume"]
    finally:
        for p in runs:  # a failed check leaves no run of 100000 steps behind
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_a_closed_stdout_stops_the_run_in_one_line(data_dir, tmp_path):
    """`python train.py | head`: the log reaches the reader line by line, and when the reader leaves the run
    stops with one line saying what was kept, not a BrokenPipeError traceback."""
    # `python train.py >&-` (checked at the end) starts first: its torch import overlaps the run below
    no_stdout = subprocess.Popen([sys.executable, "train.py", *TINY, f"--data_dir={data_dir}", "--dry_run"], cwd=HERE,
                                 stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1))  # `>&-`
    p = subprocess.Popen([sys.executable, "train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}",
                          "--max_iters=100000", "--eval_interval=2"], cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"})  # as in a user's shell
    chunks = []
    while b"\nstep 3/" not in b"".join(chunks):  # after the checkpoint of step 2
        chunks.append(os.read(p.stdout.fileno(), 1 << 16))
        assert chunks[-1], p.communicate()[1].decode()
    # Flushed line by line: the first read wakes on the plan's lines, long before the first step is logged
    # (in 8 KB blocks it would hold some 60 steps).
    assert b"\nstep " not in chunks[0]
    p.stdout.close()
    _, err = p.communicate(timeout=60)
    ckpt = tmp_path / "run" / "ckpt.pt"
    assert p.returncode == 1, err
    assert err.decode().strip().splitlines() == [f"stopped: the reader of stdout left; {ckpt}, from the last evaluation, continues with --resume"]
    r = finish(no_stdout, timeout=120)
    assert r.returncode == 0 and r.stderr == ""


def test_help_and_a_dry_run_to_a_gone_reader_or_a_full_disk_are_one_line(data_dir):
    """--help and the log to a pipe whose reader has left (`| head`), or to /dev/full: one line, naming stdout."""
    r, w = os.pipe()
    os.close(r)  # the reader left before a word was written
    dry = [*TINY, f"--data_dir={data_dir}", "--dry_run"]
    with open("/dev/full", "w") as full:
        runs = [subprocess.Popen([sys.executable, "train.py", *args], cwd=HERE, stdout=out, stderr=subprocess.PIPE, text=True)
                for out in (w, full) for args in (["--help"], dry)]
    os.close(w)
    gone_help, gone_dry, full_help, full_dry = [finish(p, timeout=120) for p in runs]
    assert (gone_help.returncode, gone_help.stderr) == (0, "")  # quiet, as argparse's scripts
    assert (gone_dry.returncode, gone_dry.stderr) == (1, "stopped: the reader of stdout left; a dry run writes nothing\n")
    assert (full_help.returncode, full_help.stderr) == (1, "error: cannot write the help to stdout: No space left on device\n")
    assert (full_dry.returncode, full_dry.stderr) == (1, "error: cannot write the log to stdout: No space left on device\n")


@pytest.mark.parametrize("script", ["train.py", "sample.py", "eval.py", "bench.py", "model.py", "prepare_data.py"])
def test_ctrl_c_while_torch_loads_is_not_a_traceback(script, tmp_path):
    """SIGINT once libtorch (numpy, for prepare_data.py) is mapped into the process, that is, inside its import."""
    args = ["--source=files:/nonexistent/*", f"--out_dir={tmp_path}"] if script == "prepare_data.py" else []  # writes nothing
    library = "_multiarray_umath" if script == "prepare_data.py" else "libtorch"
    p = subprocess.Popen([sys.executable, script, *args], cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while p.poll() is None and time.time() < deadline:
        with open(f"/proc/{p.pid}/maps") as f:
            if library in f.read():
                break
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err and out == "", err


def test_a_nan_loss_stops_the_run_and_keeps_the_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "run")
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--eval_interval=2", "--max_iters=40"]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # as on one of two machines: files may differ, errors are each rank's own
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(train.ConfigError, match=r"loss is (nan|inf) at step \d+; stopping \(the last good checkpoint is"):
        train.main([*args, "--matrix_lr=1e4", "--warmup_iters=1"])  # diverges within a few steps
    assert train.RUN["alike"] is True  # but the loss is averaged over the ranks: rank 0 reports it for all
    saved = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)  # the last good checkpoint is intact
    assert all(torch.isfinite(v).all() for v in saved["model"].values())
    stale = tmp_path / "stale"  # a folder that was there before: a run that saves no checkpoint leaves no metrics in it
    stale.mkdir()
    capsys.readouterr()
    with pytest.raises(train.ConfigError, match=r"^loss is (nan|inf) at step \d+; stopping \(no checkpoint was written") as e:
        train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={stale}", "--max_iters=40", "--matrix_lr=1e4", "--warmup_iters=1"])
    logged = [int(n) for n in re.findall(r"^step (\d+)/40 ", capsys.readouterr().out, re.M)]  # --log_interval=1
    assert int(re.search(r"at step (\d+);", str(e.value))[1]) == logged[-1] + 1  # the step the log would have called it
    assert os.listdir(stale) == [".lock"]


def test_one_run_per_out_dir_and_no_rebuild_under_a_run(data_dir, tmp_path, capsys):
    """A second train.py into the same --out_dir, or prepare_data.py --force on the data a run reads, is refused
    in one line while the first runs (folder locks); a killed save's temporary file is cleared by the next run."""
    import prepare_data as pd
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.pt.tmp12345").write_bytes(b"half a checkpoint")
    p = subprocess.Popen([sys.executable, "train.py", *TINY, f"--data_dir={data}", f"--out_dir={out}", "--max_iters=100000",
                          "--eval_interval=100000"], cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if line.startswith("step 1/"):
                break
        assert not (out / "ckpt.pt.tmp12345").exists()
        with pytest.raises(train.DataError, match=f"^another train.py is writing {out}; wait for it to end, or choose another --out_dir$"):
            train.main([*TINY, f"--data_dir={data}", f"--out_dir={out}", "--max_iters=2", "--seed=9"])
        before = {f: (data / f).read_bytes() for f in ("meta.json", "tokenizer.json")}
        corpus = tmp_path / "c.txt"
        corpus.write_text("a few words of text\n" * 50)
        with pytest.raises(SystemExit) as e:
            pd.main(["--source", f"files:{corpus}", "--vocab_size", "300", "--out_dir", str(data), "--force"])
        assert e.value.code == (f"prepare_data.py: error: {data} is in use: another prepare_data.py is writing it, or a "
                                "train.py is reading it; wait for it to end")
        assert {f: (data / f).read_bytes() for f in before} == before
        # the command that prepared it, again: nothing to do, which a reader does not stop
        pd.main([f"--source=files:{os.path.dirname(data_dir)}/*.txt", f"--out_dir={data}", "--vocab_size=300", "--val_tokens=3000"])
        assert re.search(r"/data is already prepared \([\d,]+ train / [\d,]+ val tokens\); nothing to do$", capsys.readouterr().out.strip())
    finally:
        p.kill()
        p.communicate(timeout=60)
    train.main([*TINY, f"--data_dir={data}", f"--out_dir={tmp_path / 'other'}", "--max_iters=2"])  # locks end with the run


def test_a_refused_run_never_removes_the_winners_folder(data_dir, tmp_path, monkeypatch):
    """Two runs start on a new --out_dir and the other one makes it and locks it first: the refused run
    leaves that folder and its lock alone (it removes only a folder it made and locked itself)."""
    import prepare_data as pd
    out, winner = tmp_path / "new" / "run", {}
    def the_other_run_wins(path, real=train.missing_top):
        top = real(path)  # missing when this run looked ...
        os.makedirs(path)  # ... then the other run made it and took its lock
        winner["lock"] = pd.lock_folder(path, True, "busy")
        return top
    monkeypatch.setattr(train, "missing_top", the_other_run_wins)
    with pytest.raises(train.DataError, match="^another train.py is writing"):
        train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2"])
    assert os.listdir(out) == [".lock"]
    winner.pop("lock").close()
    # the same in prepare_data.py, where the window is between finding the folder missing and locking it
    corpus = tmp_path / "c.txt"
    corpus.write_text("a few words of text\n" * 50)
    monkeypatch.setattr(pd, "missing_top", the_other_run_wins)
    with pytest.raises(SystemExit, match="is in use: another prepare_data.py is writing it"):
        pd.main(["--source", f"files:{corpus}", "--vocab_size", "300", "--out_dir", str(tmp_path / "data")])
    assert os.listdir(tmp_path / "data") == [".lock"]
    winner.pop("lock").close()


def test_a_run_stopped_between_making_its_out_dir_and_training_leaves_no_folder(data_dir, tmp_path, monkeypatch):
    """Refusals that come after --out_dir is made (the vocabulary, the CORE bundle, a reader that left) remove it again."""
    for name, args in (("vocab", ["--vocab_size=100"]),
                       ("core", ["--core_eval", f"--eval_bundle={tmp_path / 'nowhere'}"])):
        out = tmp_path / "new" / name
        with pytest.raises((train.ConfigError, ev.EvalError)):
            train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2", *args])
        assert not (tmp_path / "new").exists(), name


def test_every_rank_checks_out_dir_and_only_rank_0_claims_it(tmp_path, monkeypatch):
    """Under torchrun each rank refuses an unusable --out_dir itself (else the others die in DDP's constructor,
    waiting for rank 0); only rank 0 locks the folder and takes it for main() to remove after a failed start."""
    monkeypatch.setattr(train, "RUN", {"ckpt": None})
    (tmp_path / "afile").write_text("")
    for master in (True, False):
        with pytest.raises(train.ConfigError, match=f"^--out_dir {tmp_path / 'afile'} is a file, not a folder$"):
            train.claim_out_dir({"out_dir": str(tmp_path / "afile"), "data_dir": str(tmp_path / "data")}, None, False,
                                master, str(tmp_path / "afile" / "ckpt.pt"))
    out = str(tmp_path / "run")
    s = {"out_dir": out, "data_dir": str(tmp_path / "data")}
    train.claim_out_dir(s, out, False, False, os.path.join(out, "ckpt.pt"))  # rank 1: the folder is made, nothing held
    assert os.path.isdir(out) and train.RUN == {"ckpt": None}
    train.claim_out_dir(s, out, False, True, os.path.join(out, "ckpt.pt"))  # rank 0
    assert train.RUN["made"] == (out, out) and train.RUN.pop("out_lock").close() is None


def test_a_stopped_run_removes_its_out_dir_before_it_unlocks_it(data_dir, tmp_path, monkeypatch):
    """Unlocked first, the folder could be claimed by another train.py and then removed under it."""
    import prepare_data as pd
    held = []

    def remove_unused(folder, top, real=train.remove_unused):
        try:  # flock: a second open file of this process conflicts with the run's own lock
            pd.lock_folder(folder, True, "busy").close()
            held.append(False)
        except pd.DataError:
            held.append(True)
        real(folder, top)
    monkeypatch.setattr(train, "remove_unused", remove_unused)
    out = tmp_path / "new" / "run"
    with pytest.raises(train.ConfigError, match="^--resume: no checkpoint"):  # a refusal after the folder is made
        train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2", "--resume"])
    assert held == [True] and not (tmp_path / "new").exists()


def test_ctrl_c_during_a_save_waits_for_it():
    """A SIGINT inside ctrl_c_after() (where train.py saves its checkpoint) lets the block finish, then interrupts."""
    done = []
    with pytest.raises(KeyboardInterrupt):
        with train.ctrl_c_after():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs between bytecodes: here, not at the end of the block
            done.append(True)
    assert done == [True] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    terminate = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):  # SIGTERM too (train.py's main() then exits 143)
        with train.ctrl_c_after():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            done.append(True)
    assert done == [True, True] and train.RUN["signal"] == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is terminate
    with train.ctrl_c_after():  # without a Ctrl-C, nothing happens
        pass


def test_a_signal_started_ignored_stays_ignored_during_a_save():
    """A process started with SIGINT ignored (`python train.py &` in a script: Ctrl-C is for the foreground job) is not
    stopped by a SIGINT during a checkpoint save (ctrl_c_after), and SIGINT stays ignored after it."""
    replaced = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        done = []
        try:
            with train.ctrl_c_after():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                done.append(True)
        except KeyboardInterrupt:
            pytest.fail("the ignored SIGINT stopped the run after the save")
        assert done == [True] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, replaced)


SIGNALS_AT_EXIT = """
import runpy, signal, sys
kind = lambda h: {signal.SIG_IGN: "ignored", signal.SIG_DFL: "default"}.get(h, "handled")
scripts = sys.argv[1:]
for start in (signal.SIG_IGN, signal.SIG_DFL):
    for script in scripts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, start)  # as the process would have started: ignored, or the default
        sys.argv = [script, "--help"]
        print("===", script, flush=True)  # where its help begins on stdout
        code = 0  # the exit status, as Python gives it: 0 for a script that returns, or exits with None
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = 0 if e.code is None else e.code
        sys.stdout.flush()
        print(script, *(kind(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)), "exit", code, file=sys.stderr)
"""


def test_the_scripts_leave_ignored_signals_ignored():
    """Each script, started with SIGINT and SIGTERM ignored (a background job of a non-interactive shell ignores
    SIGINT), leaves them ignored, as Python leaves SIGINT; started with the defaults, it handles SIGINT, and SIGTERM
    where it has cleanup to do (train.py, bench.py, eval.py). Each script's --help, all in one process: each exits 0,
    and train.py's help (to a pipe) says what each setting and size is."""
    scripts = ["train.py", "sample.py", "eval.py", "bench.py", "model.py", "prepare_data.py"]
    r = subprocess.run([sys.executable, "-c", SIGNALS_AT_EXIT, *scripts], cwd=HERE, capture_output=True, text=True,
                       timeout=120)
    term = lambda script: "handled" if script in ("train.py", "bench.py", "eval.py") else "default"
    want = [f"{s} ignored ignored exit 0" for s in scripts] + [f"{s} handled {term(s)} exit 0" for s in scripts]
    assert r.returncode == 0 and r.stderr.splitlines() == want, r.stderr
    helps = re.findall(r"^=== (\S+)\n(.*?)(?=^=== |\Z)", r.stdout, re.S | re.M)
    assert [script for script, _ in helps] == scripts * 2
    train_help = helps[len(scripts)][1]  # started with the default handlers, as from a shell
    assert "--matrix_lr=0.02" in train_help and "Settings resolve in this order" in train_help
    assert "\n  cpu: target_flops=1.15e+13, total_batch_tokens=4096," in train_help  # what the default size changes
    assert "Variants (--variant): baseline, bov, t1_r01," in train_help


def test_ctrl_c_while_torch_loads_is_one_line_and_exit_130(tmp_path):
    """Each script, stopped while its first heavy import loads (a stand-in numpy and torch here, which say so and
    wait), prints its one line and exits 130, as after it has loaded (no traceback, no silent exit); train.py,
    which handles SIGTERM once loaded, does the same with it: one line and exit 143, not killed by the signal."""
    for name in ("numpy", "torch"):
        (tmp_path / f"{name}.py").write_text("import os, time\nos.write(1, b'loading\\n')\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    scripts = ["train.py", "sample.py", "eval.py", "bench.py", "model.py", "prepare_data.py"]
    start = lambda script, **kw: subprocess.Popen([sys.executable, script], cwd=HERE, env=env, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True, **kw)
    runs = [start(s) for s in scripts] + [start("train.py", preexec_fn=lambda: os.close(2))]  # and stderr closed (`2>&-`)
    term = start("train.py")
    for script, p in zip(scripts + ["train.py"], runs):
        assert p.stdout.readline() == "loading\n", script
        p.send_signal(signal.SIGINT)
        r = finish(p, 60)
        assert (r.returncode, r.stdout) == (130, ""), script
        assert r.stderr == ("" if p is runs[-1] else f"{script}: interrupted\n"), script
    assert term.stdout.readline() == "loading\n"
    term.send_signal(signal.SIGTERM)
    r = finish(term, 60)
    assert (r.returncode, r.stdout, r.stderr) == (143, "", "train.py: terminated (SIGTERM)\n")


def test_a_second_stop_signal_does_not_cut_the_cleanup_short():
    """As the script installs it, stop_signal raises once; the signals after it are ignored, so main()'s
    cleanup (a finally block here) runs to its end."""
    previous = {sig: signal.signal(sig, train.stop_signal) for sig in train.STOP_SIGNALS}
    cleaned = []
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # the second, during the cleanup
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                cleaned.append(True)
        assert cleaned == [True] and train.RUN["signal"] == signal.SIGTERM
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_run_stopped_before_training_names_the_checkpoint_it_leaves(data_dir, tmp_path, monkeypatch):
    """The last line of a stopped run (stopped_note) names the checkpoint that --resume continues from, even
    when it stops while loading, before the model exists; without one it says when the first comes."""
    out = tmp_path / "run"
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=7"]
    monkeypatch.setitem(train.RUN, "ckpt", None)
    def stop(*a, **k):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(train, "Batches", stop)  # Ctrl-C while the data loads
        with pytest.raises(KeyboardInterrupt):
            train.main(args)
    assert train.stopped_note() == "no checkpoint was written yet (the first comes at step 2)"  # the last step saves
    train.main(args)
    monkeypatch.setitem(train.RUN, "ckpt", None)
    monkeypatch.setattr(train, "Batches", stop)
    with pytest.raises(KeyboardInterrupt):
        train.main([*args, "--resume"])
    assert train.stopped_note() == f"{out / 'ckpt.pt'}, from the last evaluation, continues with --resume"


def test_ctrl_c_during_a_save_still_writes_the_metrics_of_that_checkpoint(data_dir, tmp_path, monkeypatch):
    """metrics.jsonl always matches ckpt.pt: a Ctrl-C held during the save is raised after both are written."""
    save = GPT.save_checkpoint
    def interrupted_save(self, path, **kw):
        os.kill(os.getpid(), signal.SIGINT)
        save(self, path, **kw)
    monkeypatch.setattr(GPT, "save_checkpoint", interrupted_save)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train.main([*TINY, f"--data_dir={data_dir}", "--max_iters=4", "--eval_interval=2", f"--out_dir={out}"])
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 2 and [r["step"] for r in records(out, "eval")] == [0, 2]
    assert [json.loads(json.dumps(r)) for r in ckpt["metrics"]] == [r for r in map(json.loads, open(out / "metrics.jsonl"))]


def test_torchrun_environment_is_checked(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert train.ranks() == (False, 0, 0, 1)
    full = dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="localhost", MASTER_PORT="29500")
    for k, v in full.items():
        monkeypatch.setenv(k, v)
    assert train.ranks() == (True, 1, 1, 2)
    # LOCAL_RANK above RANK (mutant T15: checked only against WORLD_SIZE): torchrun's rank is node x nproc + local rank
    for bad in (dict(RANK="abc"), dict(WORLD_SIZE="0"), dict(LOCAL_RANK="2"), dict(RANK="0"), dict(MASTER_ADDR="")):
        monkeypatch.setattr(os, "environ", {**full, **bad})
        with pytest.raises(train.ConfigError, match="^RANK is set, but torchrun's environment is incomplete or invalid "
                                                    r"\(RANK=.*; start with torchrun, or unset RANK for one process$"):
            train.ranks()
    monkeypatch.setattr(os, "environ", {"RANK": "1"})  # a stray RANK, no torchrun: the one process says so
    with pytest.raises(train.ConfigError) as e:
        train.main(["--warmdown_frac=2"])
    assert train.error_line(e.value, train.RUN["rank"], train.RUN["alike"]).startswith("error: RANK is set, but torchrun's")


def test_device_cuda_without_an_index_selects_gpu_0(monkeypatch):
    """torch.cuda.set_device("cuda") raises: --device=cuda (and auto) must name the index. Checked on
    a CPU build with torch.cuda faked; .ci/gpu_check runs the real thing."""
    seen = []

    def set_device(name):  # what torch does with a name that has no index
        if ":" not in str(name):
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{name}")
        if name == "cuda:7":  # what torch says of an index past the last GPU
            raise RuntimeError("CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported")
        seen.append(name)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    for device in ("cuda", "auto", "cuda:0"):
        with pytest.raises(train.ConfigError):  # a CPU build cannot make the tensor: refused in one line
            train.setup_device({"device": device})
    assert seen == ["cuda:0", "cuda:0", "cuda:0"]
    with pytest.raises(train.ConfigError, match="^--device cuda:7 is not usable here: CUDA error: invalid device ordinal$"):
        train.setup_device({"device": "cuda:7"})
    monkeypatch.setattr(train, "RUN", {"alike": True})
    with pytest.raises(train.ConfigError, match="^--device bogus is not usable here"):
        train.setup_device({"device": "bogus"})
    assert train.RUN["alike"] is True  # a setting every rank meets alike: rank 0 reports it
    for k, v in dict(RANK="7", LOCAL_RANK="7", WORLD_SIZE="8", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(k, v)  # rank 7 of torchrun on a machine with fewer GPUs
    with pytest.raises(train.ConfigError, match=r"^--device cuda:7 \(torchrun's LOCAL_RANK=7: more --nproc_per_node than GPUs\?\) "
                                                r"is not usable here: CUDA error: invalid device ordinal$"):
        train.setup_device({"device": "auto"})
    assert train.RUN["alike"] is False  # this rank's own: it reports it, named (the ranks before it have GPUs)
    # rank 9 of 16 is local rank 1 on the second machine: cuda:1, not cuda:9 (mutant T24: RANK taken for the GPU index)
    seen.clear()
    for k, v in dict(RANK="9", LOCAL_RANK="1", WORLD_SIZE="16", MASTER_ADDR="10.0.0.1").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(train.ConfigError, match=r"^--device cuda:1 is not usable here"):  # the CPU build's refusal, after the choice
        train.setup_device({"device": "cuda"})
    assert seen == ["cuda:1"]


def test_auto_finds_no_gpu_for_a_paper_size_and_says_why(monkeypatch):
    """--device=auto without a GPU trains the cpu size on the CPU, and refuses a paper size (meant for a GPU), naming
    the possible causes: a CPU build of torch, a CUDA build that sees no GPU (none, CUDA_VISIBLE_DEVICES, a driver
    older than its CUDA), a ROCm build that sees none; --device=cpu runs it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(train, "keep_freed_memory", lambda device: False)
    assert train.setup_device({"device": "auto", "size": "cpu"}) == torch.device("cpu")
    assert train.setup_device({"device": "cpu", "size": "paper_780m"}) == torch.device("cpu")
    for cuda, hip, why in ((None, None, f"this torch, {torch.__version__}, is built without CUDA"),
                           ("13.0", None, "none in this machine, hidden by CUDA_VISIBLE_DEVICES, or a driver older than "
                                          "this torch's CUDA 13.0"),
                           (None, "7.1", "none visible to this ROCm build of torch")):
        monkeypatch.setattr(torch.version, "cuda", cuda)
        monkeypatch.setattr(torch.version, "hip", hip)
        with pytest.raises(train.ConfigError) as e:
            train.setup_device({"device": "auto", "size": "paper_135m"})
        assert str(e.value) == (f"--device=auto found no GPU ({why}), and --size=paper_135m is meant for one; pass "
                                "--device=cpu to run it on the CPU anyway (README, GPU quick start)")


def test_data_being_written_is_said_so(data_dir, tmp_path, monkeypatch):
    """While prepare_data.py holds its data folder (it removes meta.json first), train.py says so, not 're-run
    prepare_data.py'; data prepared again between the plan and the data's lock is refused."""
    import prepare_data as pd
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    args = [*TINY, f"--data_dir={data}", f"--out_dir={tmp_path / 'run'}", "--max_iters=2"]
    with pd.lock_folder(str(data), True, "held by the test"):
        with pytest.raises(train.DataError) as e:  # a complete folder being written
            train.main(args)
        assert str(e.value) == f"{data} is being written by prepare_data.py; wait for it to finish"
        os.replace(data / "meta.json", data / "progress.json")  # a preparation under way (or a run's out_dir)
        with pytest.raises(train.DataError) as e:
            train.main(args)
        assert str(e.value) == (f"{data} is being written by another process (prepare_data.py preparing it, or a "
                                f"train.py whose --out_dir it is); wait for it to finish")
    plain = tmp_path / "plain"  # a folder nobody locked: the usual line, and no lock file left in it
    plain.mkdir()
    with pytest.raises(train.DataError, match="^no prepared data in "):
        train.main([*args, f"--data_dir={plain}"])
    assert os.listdir(plain) == []
    with pytest.raises(train.DataError) as e:  # one that was stopped
        train.main(args)
    assert str(e.value).startswith(f"preparation of {data} is incomplete; re-run prepare_data.py")
    os.replace(data / "progress.json", data / "meta.json")
    meta = json.loads((data / "meta.json").read_text())
    lock_folder = train.lock_folder

    def prepared_again(folder, *a):  # another preparation ends just before the lock
        if folder == str(data):
            (data / "meta.json").write_text(json.dumps({**meta, "train_docs": meta["train_docs"] + 1}))
        return lock_folder(folder, *a)
    monkeypatch.setattr(train, "lock_folder", prepared_again)
    with pytest.raises(train.ConfigError) as e:
        train.main(args)
    assert str(e.value) == f"{data} was prepared again as this run started; start it again"
    assert not (tmp_path / "run").exists()


def test_a_failed_save_or_damaged_data_is_one_line(data_dir, tmp_path, monkeypatch):
    """A full disk while saving (torch.save raises RuntimeError) keeps the last good checkpoint; a token
    id outside the vocabulary, in a shard that passes its header checks, is refused before it is used;
    a checkpoint whose step is past the run's end is refused on resume."""
    out = str(tmp_path / "run")
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--eval_interval=2", "--max_iters=4"]
    save, calls = torch.save, []

    def full_disk(*a, **k):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 512 vs 448")
        return save(*a, **k)
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(train.ConfigError) as e:
        train.main(args)
    assert str(e.value) == ("could not write the checkpoint at step 4 (RuntimeError: [enforce fail at inline_container.cc:672] "
                            f". unexpected pos 512 vs 448; is the disk full?); the last good checkpoint {out}/ckpt.pt is kept")
    monkeypatch.setattr(torch, "save", save)
    assert torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["step"] == 2
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    ckpt["step"] = 100
    torch.save(ckpt, os.path.join(out, "ckpt.pt"))
    with pytest.raises(train.ConfigError, match=r"is at step 100, outside this run's 0\.\.4 iterations"):
        train.main([*args, "--resume"])
    damaged = tmp_path / "data"
    for split, name in (("train", "train"), ("val", "validation")):
        shutil.rmtree(damaged, ignore_errors=True)
        shutil.copytree(data_dir, damaged)
        shard = next(f for f in sorted(os.listdir(damaged)) if f.startswith(split + "_"))
        # all through the shard, so the first batch meets one; 300, the first id past the vocabulary (mutant M4: `>`)
        np.memmap(damaged / shard, dtype=np.uint16, mode="r+", offset=24)[1::7] = 300
        for vocab in ([], ["--vocab_size=512"]):  # the model's vocabulary may be larger than the data's: still damaged
            with pytest.raises(train.DataError, match=rf"the {name} data in .* holds token id 300, outside its "
                                                      rf"vocabulary of 300: it is damaged"):
                train.main([*TINY, f"--data_dir={damaged}", f"--out_dir={tmp_path / 'run2'}", "--max_iters=2", *vocab])
    # a cut tokenizer: refused before training, as sample.py and eval.py would refuse it (a checkpoint trained beside
    # it would record its hash, and the mended tokenizer would then never read it)
    shutil.rmtree(damaged)
    shutil.copytree(data_dir, damaged)
    tok = damaged / "tokenizer.json"
    tok.write_bytes(tok.read_bytes()[:1000])
    with pytest.raises(train.DataError, match=r"tokenizer\.json is unreadable \(.*\); re-run prepare_data\.py with --force"):
        train.main([*TINY, f"--data_dir={damaged}", f"--out_dir={tmp_path / 'run3'}", "--max_iters=2"])
    assert not (tmp_path / "run3").exists()


# ---------------------------------------------------------------------------- epoch warnings, the logged loss, table_lr and weight decay

def test_a_real_run_past_one_epoch_warns_and_logs_the_debiased_loss(data_dir, tmp_path, capsys):
    """Mutants T2 (the epoch warning only past 2 epochs), T3 ("starts epoch 1" for the second epoch),
    T4 (the logged loss not debiased: 0.1 x the loss at step 1)."""
    meta = load_meta(data_dir)
    epoch_tokens = train.Batches(load_tokens(data_dir, "train"), meta["bos_id"], 32, 3).rows_per_epoch() * 32
    iters = epoch_tokens // 1024 + 1  # just past one epoch (1.01) at 1024 tokens a step: into epoch 2, short of 2 epochs
    out = str(tmp_path / "run")
    train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", f"--max_iters={iters}", "--eval_interval=100000",
                "--device_batch_size=32", "--total_batch_tokens=1024"])
    stdout = capsys.readouterr().out
    assert f"WARNING: this run reads {iters * 1024 / epoch_tokens:.2f} epochs of {data_dir}" in stdout
    assert re.search(rf"WARNING: step \d+ starts epoch 2 of {re.escape(data_dir)}", stdout)
    assert "starts epoch 1 of" not in stdout and "starts epoch 3 of" not in stdout
    logged = {int(k): float(v) for k, v in re.findall(r"^step (\d+)/\d+ \| loss ([\d.]+)", stdout, re.M)}
    l1, l2 = [r["loss"] for r in records(out, "train")][:2]
    assert logged[1] == pytest.approx(l1, abs=1e-4)
    assert logged[2] == pytest.approx((0.09 * l1 + 0.1 * l2) / 0.19, abs=1e-4)


def test_a_resume_restores_every_rng(data_dir, tmp_path):
    """Mutants: restore without set_rng_states, or a reseed after it (nothing in training draws from the
    global RNGs today, so the losses hide both; dropout or a sampled eval added later would not resume
    exactly). The checkpoint's states are replaced by another seed's, which a resume must leave in place."""
    base = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", "--max_iters=2"]
    train.main(base)
    path = tmp_path / "run" / "ckpt.pt"
    ckpt = torch.load(path, weights_only=True)
    torch.manual_seed(12345), np.random.seed(12345), random.seed(12345)
    ckpt["rng"] = train.rng_states()
    draws = (random.random(), np.random.rand(), torch.rand(1).item())  # what the saved states draw next
    torch.save(ckpt, path)
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    train.main([*base, "--resume"])  # finished: restored, then nothing left to train
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == draws


def test_table_lr_and_weight_decay_reach_the_optimizers_and_bind_a_resume(data_dir, tmp_path):
    """Mutants T9 (--table_lr not passed to configure_optimizers) and T10 (a resume with another
    table_lr or weight_decay accepted)."""
    base = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", "--max_iters=2", "--variant=bov"]
    train.main([*base, "--table_lr=0.05", "--weight_decay=0.1"])
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    muon, adamw = (o["param_groups"] for o in ckpt["optimizers"])
    tables = [g for g in adamw if g["name"] == "tables"]
    assert len(tables) == 1 and tables[0]["initial_lr"] == pytest.approx(0.05 * (32 / 768) ** -0.5)
    assert muon[0]["weight_decay"] == 0.1
    for flag, expected in (("--table_lr=0.06", "table_lr=0.05 there, 0.06 here"),
                           ("--weight_decay=0.2", "weight_decay=0.1 there, 0.2 here"),
                           # the schedule and the batch too (mutants R1, R2, R3)
                           ("--total_batch_tokens=256", "total_batch_tokens=128 there, 256 here"),
                           ("--warmup_iters=1", "warmup_iters=2 there, 1 here"),
                           ("--final_lr_frac=0.1", "final_lr_frac=0.05 there, 0.1 here"),
                           ("--warmdown_frac=0.5", "warmdown_frac=0.65 there, 0.5 here"),
                           # every rate (mutant: scalar_lr left out; a resume kept the checkpoint's
                           # initial_lr and recorded a rate it never used)
                           ("--embedding_lr=0.2", "embedding_lr=0.3 there, 0.2 here"),
                           ("--unembedding_lr=0.004", "unembedding_lr=0.008 there, 0.004 here"),
                           ("--scalar_lr=0.25", "scalar_lr=0.5 there, 0.25 here")):
        with pytest.raises(train.ConfigError, match=re.escape(expected)):
            train.main([*base, "--table_lr=0.05", "--weight_decay=0.1", flag, "--resume"])



# ---------------------------------------------------------------------------- from a mutation audit of train.py
# (the audit's mutant IDs in the docstrings)

# schedule and budget

def test_warmup_ends_at_the_peak_and_the_schedule_never_exceeds_it():
    """T01 (`step <= warmup`: lrm 1.025 at step == warmup), T07 (no `max(1, ...)`: a tiny budget plans 0 steps)."""
    for total, warmup in ((100, 40), (7, 2), (3, 5)):
        lrms = [train.lr_multiplier(k, total, warmup, 0.35, 0.05) for k in range(total)]
        assert max(lrms) <= 1.0
    assert train.lr_multiplier(40, 100, 40, 0.35, 0.05) == 1.0
    s, _ = train.resolve_settings(["--size=paper_135m", "--target_tokens=1000"])  # far below one step's 524,288 tokens
    assert train.plan_iterations(s, 1) == 1


def test_a_run_applies_the_schedule_to_every_optimizer_and_logs_tokens_and_flops(data_dir, tmp_path):
    """T16 (`g["lr"] *= lrm`: the schedule compounds), T17 (only the first optimizer scheduled: AdamW at its
    peak throughout), T18 (lr_multiplier(step + 1): the schedule one step early), T23 (an eval record's flops
    without the batch tokens), T24 (its tokens from the device batch), T37 (the last step not logged when
    log_interval does not divide it)."""
    out = tmp_path / "run"
    iters, warmup = 7, 2
    train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", f"--max_iters={iters}", "--eval_interval=3",
                "--log_interval=2", "--variant=bov"])
    want = lambda step: train.lr_multiplier(step, iters, warmup, 0.65, 0.05)  # TINY: warmup 2, default warmdown
    logged = records(str(out), "train")
    assert [r["step"] for r in logged] == [2, 4, 6, 7]
    assert all(r["tokens"] == r["step"] * 128 for r in logged)  # M6: a train record's tokens from the device batch
    assert all(r["lrm"] == pytest.approx(want(r["step"] - 1)) for r in logged)  # record `step` follows the step it logs
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    groups = [g for opt in ckpt["optimizers"] for g in opt["param_groups"]]
    assert len(groups) >= 2
    for g in groups:  # every group of every optimizer, at the last step's multiplier
        assert g["lr"] == pytest.approx(g["initial_lr"] * want(iters - 1)), g.get("name")
    fpt = GPT.meta(GPTConfig(**ckpt["model_config"])).estimate_flops()
    for r in records(str(out), "eval"):
        assert r["tokens"] == r["step"] * 128 and r["flops"] == r["tokens"] * fpt


def test_accumulated_gradients_are_the_mean_over_micro_batches(data_dir, tmp_path, monkeypatch, capsys):
    """T19 (`loss.backward()` without / accum: the gradient is accum times too large; Muon and AdamW all but hide
    it, so no loss comparison sees it). The first step's gradient with 2 micro-batches of 4 rows equals that of
    one batch of the same 8 rows, with a padded row in the first micro-batch: the loss is the mean over the step's
    target tokens (a mean of the micro-batches' means weighed a token of the padded one, about 98 targets, 1.3
    times one of the other's 128). T44 (the console's smoothed loss fed loss x accum): the logged loss of step 1 is
    the recorded one, with accumulation too. Mutant t03 (targets counted as `> 0`: a target of id 0, "!" in GPT-2's
    vocabulary, left out of the count, and the step's loss and gradient scaled up): the recorded loss is the initial
    model's own mean loss over the step's targets, four of them id 0."""
    next_rows, steps, initial = train.Batches.next_rows, [], []
    spies = {bs: first_gradient_spy(tmp_path / f"g{bs}") for bs in (4, 8)}  # each wrapping the real configure_optimizers

    def padded(self, n):
        rows = next_rows(self, n)
        rows[0, 3:] = -1  # 2 targets left in the step's first row, as the tail of a cut document can leave
        rows[1, 5:9] = 0  # four targets of id 0
        steps.append(rows.copy())
        return rows
    monkeypatch.setattr(train.Batches, "next_rows", padded)
    for bs in (4, 8):  # accumulation 2, then 1
        monkeypatch.setattr(GPT, "configure_optimizers",
                            lambda self, *a, **k: initial.append(copy.deepcopy(self)) or spies[bs](self, *a, **k))
        train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / str(bs)}", "--max_iters=1",
                    "--total_batch_tokens=256", f"--device_batch_size={bs}"])
        logged = float(re.search(r"^step 1/1 \| loss ([\d.]+)", capsys.readouterr().out, re.M).group(1))
        recorded = records(str(tmp_path / str(bs)), "train")[0]["loss"]
        assert logged == pytest.approx(recorded, abs=1e-4)
        with torch.no_grad():
            own = initial[-1](*train.to_batch(steps[-1], load_meta(data_dir)["bos_id"], torch.device("cpu")))[1]
        assert recorded == pytest.approx(own.item(), rel=1e-5)
    g2, g1 = torch.load(tmp_path / "g4.0"), torch.load(tmp_path / "g8.0")
    assert ((g2 - g1).norm() / g1.norm()).item() < 1e-5  # the same sum in another order (a mean of means: 3.5e-3)


# resume and metrics

def stop_after_step_2(args, monkeypatch):
    """train.main(args), stopped (as by Ctrl-C) once the metrics of the step-2 checkpoint are written."""
    write_jsonl = train.write_jsonl

    def then_stop(path, recs):
        write_jsonl(path, recs)
        if any(r["type"] == "eval" and r["step"] == 2 for r in recs):
            raise KeyboardInterrupt
    monkeypatch.setattr(train, "write_jsonl", then_stop)
    with pytest.raises(KeyboardInterrupt):
        train.main(args)
    monkeypatch.setattr(train, "write_jsonl", write_jsonl)


def test_a_resume_keeps_the_metrics_file_and_does_not_repeat_the_evaluation(data_dir, tmp_path, monkeypatch):
    """T25 (evaluated_step = None: the resumed step is evaluated again, a second eval record at that step in
    metrics.jsonl), T35 (metrics.jsonl not rewritten from the checkpoint on resume: a run killed between
    writing ckpt.pt and metrics.jsonl leaves the file a checkpoint behind, and so would the resumed run)."""
    out = tmp_path / "run"
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=4", "--eval_interval=2"]
    stop_after_step_2(args, monkeypatch)
    saved = torch.load(out / "ckpt.pt", weights_only=True)["metrics"]
    assert saved[-1]["step"] == 2
    os.remove(out / "metrics.jsonl")  # as if killed after the first ckpt.pt was written, before metrics.jsonl

    evaluate = train.evaluate

    def stop(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "evaluate", stop)  # the resumed run stops at its next evaluation
    with pytest.raises(KeyboardInterrupt):
        train.main([*args, "--resume"])
    with open(out / "metrics.jsonl") as f:
        assert [json.loads(line) for line in f] == saved

    monkeypatch.setattr(train, "evaluate", evaluate)
    train.main([*args, "--resume"])
    assert [r["step"] for r in records(str(out), "eval")] == [0, 2, 4]


# validation rows and evaluate

def test_val_rows_stop_at_the_end_of_a_short_split():
    """T30 (`len(data) // T`: a split of a whole number of rows' worth of tokens asks for one row too many,
    which is a token short, and np.stack fails)."""
    rows = train.val_rows([np.arange(96)], 8, 10 ** 6)  # eval_tokens beyond the split
    assert rows.shape == (11, 9) and rows[-1, -1] == 88
    # t07 (`len(data) // T - 1`: right only at a whole number of rows; a split of 97 lost its last row, one of 9 was refused)
    rows = train.val_rows([np.arange(97)], 8, 10 ** 6)
    assert rows.shape == (12, 9) and rows[-1, -1] == 96
    assert train.val_rows([np.arange(9)], 8, 10 ** 6).tolist() == [list(range(9))]


def test_evaluate_reads_only_its_ranks_rows(monkeypatch):
    """T27 (every rank evaluates every row: the all-reduced ratios come out the same, at world times the work)."""
    V, T = 50, 8
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("cpu", "bov", n_layer=1, n_embd=16, n_head=2, vocab_size=V, block_size=T))
    rows = np.random.default_rng(0).integers(0, V, size=(8, T + 1))
    tb = np.ones(V, dtype=np.int32)
    monkeypatch.setattr(train.dist, "all_reduce", lambda t, *a, **k: None)  # this rank's own sums
    cpu = torch.device("cpu")
    got = train.evaluate(model, rows, tb, 2, cpu, train.nullcontext(), rank=1, world=2)
    mine = train.evaluate(model, rows[[2, 3, 6, 7]], tb, 2, cpu, train.nullcontext())
    assert got == pytest.approx(mine)


# the loader

def random_docs(seed, lengths):
    rng = np.random.default_rng(seed)
    return [np.concatenate([[0], rng.integers(1, 50, size=n)]) for n in rng.integers(*lengths, size=400)]


def test_rows_closed_for_the_open_row_cap_are_kept(monkeypatch):
    """T09 (the fullest open row dropped, not packed, when OPEN_ROWS are open: tokens silently lost, only on
    a corpus large enough, e.g. climbmix), T10 (the emptiest closed instead: a fifth more rows of padding)."""
    bos, T = 0, 16
    docs = random_docs(2, (1, 16))
    shards = [np.concatenate(docs)]
    uncapped = train.Batches(shards, bos, T, seed=0).rows_per_epoch()
    monkeypatch.setattr(train.Batches, "OPEN_ROWS", 8)
    loader = train.Batches(shards, bos, T, seed=0)
    ptr, segs = loader.plan(0)
    target = np.zeros(len(shards[0]), dtype=int)
    for r in range(len(ptr) - 1):
        positions = np.concatenate([np.arange(s, s + n) for s, n in segs[ptr[r]:ptr[r + 1]]])
        target[positions[1:]] += 1
    assert (target[shards[0] != bos] == 1).all()  # every token a target once, with the cap in force
    assert len(ptr) - 1 <= 1.05 * uncapped  # closing the fullest row keeps the packing tight


def test_best_fit_takes_a_row_the_piece_fills_exactly():
    """T15 (bisect for room n + 1: a piece never goes into a row it would fill exactly)."""
    docs = [np.concatenate([[0], np.arange(1, 10)]), np.concatenate([[0], np.arange(1, 7)])]  # 10 + 7 = T + 1
    assert train.Batches([np.concatenate(docs)], 0, 16, seed=0).rows_per_epoch() == 1


def test_rows_are_shuffled_not_served_in_packing_order():
    """T08 (the final row permutation dropped: a long document's rows come one after another, so a batch holds
    consecutive windows of one document, and all the packed short documents come last)."""
    T = 16
    loader = train.Batches([np.concatenate(random_docs(3, (1, 120))[:60])], 0, T, seed=0)
    ptr, segs = loader.plan(0)
    first = segs[ptr[:-1]]
    consecutive = sum(1 for a, b in zip(first, first[1:]) if b[0] == a[0] + T)
    assert consecutive < 0.05 * len(first)


# ---------------------------------------------------------------------------- from a second mutation audit of train.py

def test_settings_at_their_limits_are_taken_and_past_them_refused():
    """S8, S9 (--eval_interval=0, --log_interval=0 accepted: a modulo by zero mid-run), S14 (--warmup_iters=-1
    accepted), S10 (a fraction of exactly 1 refused), S17 (the default out_dir without the variant: a baseline
    and a BoV run would share out/cpu)."""
    def error(args):
        with pytest.raises(train.ConfigError) as e:
            train.resolve_settings(args)
        return str(e.value)

    assert error(["--eval_interval=0"]) == "--eval_interval must be positive, got 0"
    assert error(["--log_interval=0"]) == "--log_interval must be positive, got 0"
    assert error(["--warmup_iters=-1"]) == "--warmup_iters must not be negative, got -1"
    s, _ = train.resolve_settings(["--final_lr_frac=1", "--warmdown_frac=1"])  # no decay; a run that is all warmdown
    assert (s["final_lr_frac"], s["warmdown_frac"]) == (1.0, 1.0)
    assert train.resolve_settings(["--variant=baseline"])[0]["out_dir"] == os.path.join("out", "cpu_baseline")


def test_a_config_file_may_be_a_pipe():
    """`echo max_iters=3 | python train.py /dev/stdin` (or bash's <(...)): read as a file is."""
    r = subprocess.run([sys.executable, "train.py", "/dev/stdin", "--dry_run"], cwd=HERE, input="max_iters = 3\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "plan: --max_iters -> 3 iterations" in r.stdout, r.stderr


def test_an_endless_or_huge_config_file_is_one_line(tmp_path, monkeypatch):
    """`python train.py /dev/zero` filled the memory; `matrix_lr = 10**400` was an OverflowError traceback."""
    monkeypatch.setattr(train, "CONFIG_FILE_LIMIT", 2**20)
    for arg in ("/dev/zero", str(tmp_path / "big.py")):
        if arg != "/dev/zero":
            (tmp_path / "big.py").write_text("#" * 2**20 + "\n")
        with pytest.raises(train.ConfigError, match=rf"^config file {arg} is over 1M characters: not a config file$"):
            train.resolve_settings([arg])
    (tmp_path / "big.py").write_text("#" * (2**20 - 1) + "\n")  # at the bound: read
    train.resolve_settings([str(tmp_path / "big.py")])
    (tmp_path / "lr.py").write_text("matrix_lr = 10**400\n")
    with pytest.raises(train.ConfigError, match=rf"^matrix_lr in config file {tmp_path / 'lr.py'} is an integer too large for a float \(past 1.8e308\)$"):
        train.resolve_settings([str(tmp_path / "lr.py")])


def test_a_config_files_values_are_typed_as_the_settings(tmp_path):
    """S2 (a whole float left a float: 4.096e3 tokens a step printed and saved as 4096.0), S3 (dry_run = 1 taken
    for a bool), S19 (a config file's private name, _x, refused as an unknown setting)."""
    config = tmp_path / "c.py"
    config.write_text("total_batch_tokens = 4.096e3\n")
    s, _ = train.resolve_settings([str(config)])
    assert type(s["total_batch_tokens"]) is int and s["total_batch_tokens"] == 4096
    config.write_text("dry_run = 1\n")
    with pytest.raises(train.ConfigError, match=f"^dry_run = 1 in config file {re.escape(str(config))}: expected bool$"):
        train.resolve_settings([str(config)])
    config.write_text("_x = 1\nmax_iters = 3\n")  # a helper name the file uses for itself
    assert train.resolve_settings([str(config)])[0]["max_iters"] == 3


def test_the_plan_checks_the_vocabulary_and_the_batch_split_exactly(data_dir, capsys):
    """P1 (65536, all a uint16 id can name, refused), P7 (a vocabulary one short of the data's accepted: its last
    id would index past the embedding), P2 (the batch split checked for one rank only: under torchrun 2 ranks,
    128 tokens a step cannot be 4 rows of 32 on each)."""
    dry = [*TINY, f"--data_dir={data_dir}", "--max_iters=2", "--dry_run"]
    train.main([*dry, "--vocab_size=65536"])
    assert '"vocab_size": 65536' in capsys.readouterr().out
    with pytest.raises(train.ConfigError, match=r"^vocab_size 299 is smaller than the data's vocabulary \(300\)$"):
        train.main([*dry, "--vocab_size=299"])
    s, overrides = train.resolve_settings(dry)
    with pytest.raises(train.ConfigError, match=r"^total_batch_tokens 128 is not a multiple of device_batch_size x "
                                                r"block_size x ranks = 4 x 32 x 2; e.g. --device_batch_size=2$"):
        train.plan(s, overrides, 2, lambda *a: None)


# ---------------------------------------------------------------------------- from a third mutation audit of train.py

def test_settings_limits_and_spellings(tmp_path):
    s, _ = train.resolve_settings(["--warmdown_frac=0", "--final_lr_frac=0"])  # 0 keeps the peak to the end
    assert (s["warmdown_frac"], s["final_lr_frac"]) == (0.0, 0.0)
    for key in ("matrix_lr", "unembedding_lr", "scalar_lr", "table_lr"):
        with pytest.raises(train.ConfigError, match=f"^--{key} must not be negative, got -0.1$"):
            train.resolve_settings([f"--{key}=-0.1"])
    with pytest.raises(train.ConfigError, match=r"^--total_batch_tokens must be positive, got 0$"):
        train.resolve_settings(["--total_batch_tokens=0"])
    assert train.resolve_settings(["--compile"])[0]["compile"] == "true"
    for text, value in (("0", "false"), ("no", "false"), ("off", "false"), ("1", "true"), ("on", "true")):
        assert train.resolve_settings([f"--compile={text}"])[0]["compile"] == value, text
    c = tmp_path / "c.py"  # a whole number for a float setting
    c.write_text("warmdown_frac = 1\nmatrix_lr = 0\n")
    s, _ = train.resolve_settings([str(c)])
    assert (s["warmdown_frac"], s["matrix_lr"]) == (1.0, 0.0) and type(s["warmdown_frac"]) is float


def test_seed_sets_the_data_order_and_the_init(data_dir, tmp_path):
    shards, bos = load_tokens(data_dir, "train"), load_meta(data_dir)["bos_id"]
    a, b = (train.Batches(shards, bos, 32, seed) for seed in (3, 4))
    assert not np.array_equal(a.next_rows(4), b.next_rows(4))
    losses = []
    for seed in (3, 4):
        out = str(tmp_path / str(seed))
        train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=1", f"--seed={seed}"])
        losses.append(records(out, "eval")[0]["val_loss"])  # step 0: the init alone
    assert losses[0] != losses[1]


def test_resume_with_another_target_tokens_is_refused(data_dir, tmp_path):
    base = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}"]
    train.main([*base, "--target_tokens=256", "--eval_interval=1"])
    with pytest.raises(train.ConfigError, match=re.escape("target_tokens=256 there, 512 here")):
        train.main([*base, "--target_tokens=512", "--eval_interval=1", "--resume"])


def test_metrics_file_is_replaced_whole(tmp_path):
    p = str(tmp_path / "metrics.jsonl")
    train.write_jsonl(p, [{"type": "eval", "step": 0}])
    with pytest.raises(TypeError):
        train.write_jsonl(p, [{"type": "eval", "step": 2}, {"type": "eval", "step": 4, "x": object()}])
    assert open(p).read() == '{"type": "eval", "step": 0}\n' and os.listdir(tmp_path) == ["metrics.jsonl"]


def test_exactly_one_epoch_is_not_warned(data_dir):
    meta = load_meta(data_dir)
    s, _ = train.resolve_settings([*TINY, f"--data_dir={data_dir}", "--max_iters=1"])
    cfg = GPTConfig.preset("cpu", "bov", n_layer=2, n_embd=32, n_head=2, block_size=32, vocab_size=meta["vocab_size"])
    lines = []
    loader, _, _ = train.load_data(s, meta, cfg, 0, lines.append)
    epoch = loader.rows_per_epoch() * 32
    train.load_data(s, meta, cfg, epoch, lines.append)
    assert not any("WARNING" in l for l in lines)
    train.load_data(s, meta, cfg, epoch + 32, lines.append)
    assert "WARNING: this run reads" in lines[-1]


def test_plan_boundaries(data_dir, capsys):
    dry = [*TINY, f"--data_dir={data_dir}", "--dry_run"]
    train.main([*dry, "--max_iters=2", "--eval_tokens=32"])  # one row of block_size=32 is enough
    train.main([*dry, "--max_iters=400", "--warmup_iters=141"])  # a drop to 0.996 is not told of
    assert "warm-up ends" not in capsys.readouterr().out


def test_the_step_line_times_a_resumed_run(data_dir, tmp_path, monkeypatch, capsys):
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", "--max_iters=4", "--eval_interval=2",
            "--total_batch_tokens=256"]
    stop_after_step_2(args, monkeypatch)
    clock = iter(range(0, 10 ** 6, 60))  # every step takes a minute
    monkeypatch.setattr(train, "time", types.SimpleNamespace(time=lambda: float(next(clock))))
    capsys.readouterr()
    train.main([*args, "--resume"])
    out = capsys.readouterr().out
    line = re.search(r"^step 3/4 .*$", out, re.M)[0]
    assert "dt 60000 ms | tok/s 4 | eta 1.0m" in line, line  # 256 tokens / 60 s; one step left at a minute a step
    assert re.search(r"^done: 4 steps, 1,024 tokens, val bpb [\d.]+, [\d.]+ min since the resume at step 2; ", out, re.M)


def test_a_non_finite_val_loss_stops_the_run(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(train, "evaluate", lambda *a, **k: {"val_loss": float("nan"), "val_bpb": float("nan")})
    with pytest.raises(train.ConfigError, match=r"^val loss is nan at step 0; stopping \(no checkpoint was written\)"):
        train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", "--max_iters=2"])


def test_the_last_evaluation_runs_once(data_dir, tmp_path, monkeypatch, capsys):
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", "--max_iters=2"]
    train.main(args)
    assert capsys.readouterr().out.count("eval step 2:") == 1
    monkeypatch.setattr(train, "evaluate", None)  # a finished run resumed: nothing to evaluate
    assert train.main([*args, "--resume"])["step"] == 2


def test_the_dry_run_warns_only_past_one_epoch(data_dir, monkeypatch, capsys):
    meta = load_meta(data_dir)
    monkeypatch.setattr(train, "read_meta", lambda d: dict(meta, train_tokens=256))
    train.main([*TINY, f"--data_dir={data_dir}", "--max_iters=2", "--dry_run"])  # exactly 256 tokens: one epoch
    assert "would read" not in capsys.readouterr().out
    train.main([*TINY, f"--data_dir={data_dir}", "--max_iters=3", "--dry_run"])
    assert "WARNING: this run would read about 1.50 epochs" in capsys.readouterr().out


def test_the_epoch_warning_names_the_step_that_crosses(data_dir, tmp_path, capsys):
    meta = load_meta(data_dir)
    rows = train.Batches(load_tokens(data_dir, "train"), meta["bos_id"], 32, 3).rows_per_epoch()
    # a batch of b rows that divides the epoch (as TINY's 4 does this corpus's 536 rows), so that step rows // b + 1
    # starts epoch 2 at its first row; the smallest from 16, for a few steps an epoch rather than 134
    b = next(b for b in range(16, rows + 1) if rows % b == 0)
    iters = rows // b + 2
    train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", f"--max_iters={iters}",
                f"--device_batch_size={b}", f"--total_batch_tokens={b * 32}", "--eval_interval=100000",
                "--log_interval=100000"])
    assert f"WARNING: step {rows // b + 1} starts epoch 2 of" in capsys.readouterr().out


# ---------------------------------------------------------------------------- from a fourth mutation audit of train.py

def test_the_loops_schedule_takes_the_runs_warmdown_and_final_fraction(data_dir, tmp_path):
    """L6, L7 (the loop's lr_multiplier called with the default final_lr_frac 0.05, or warmdown_frac 0.65, not
    the run's: the unit tests of lr_multiplier and the dry run's note take the settings; the run did not)."""
    out = tmp_path / "run"
    train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=6", "--eval_interval=100",
                "--warmdown_frac=0.5", "--final_lr_frac=0.5"])
    # 2 warm-up steps, then the last round(0.5 x 6) = 3 steps warm down from 1 towards 0.5 (the record of step
    # k + 1 holds the multiplier of the update k)
    want = [0.5, 1.0, 1.0, 1.0, 0.5 + 0.5 * 2 / 3, 0.5 + 0.5 / 3]
    assert [r["lrm"] for r in records(str(out), "train")] == pytest.approx(want)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    for g in (g for opt in ckpt["optimizers"] for g in opt["param_groups"]):
        assert g["lr"] == pytest.approx(g["initial_lr"] * want[-1]), g.get("name")


def test_the_warmdown_length_is_rounded_to_the_nearest_step():
    """L8 (math.ceil for round: 0.65 x 11 = 7.15 steps of warmdown taken as 8, one step of the peak lost)."""
    f = lambda step: train.lr_multiplier(step, 11, 0, 0.65, 0.05)
    assert f(3) == f(4) == 1.0  # 7 steps of warmdown: 4..10
    assert f(5) == pytest.approx(0.05 + 0.95 * 6 / 7) and f(10) == pytest.approx(0.05 + 0.95 / 7)


def test_evaluate_runs_under_the_runs_autocast_and_leaves_the_model_training():
    """B6 (evaluate without its autocast: on CUDA the validation ran in fp32 while training ran in bf16, unlike
    what --dtype says), B5 (model.train() not restored after the evaluation; nothing in the model depends on
    it today, so the losses hide it)."""
    V, T = 50, 8
    model = GPT(GPTConfig.preset("cpu", "bov", n_layer=1, n_embd=16, n_head=2, vocab_size=V, block_size=T))
    seen, forward = [], model.forward

    def spy(*a, **k):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), model.training))
        return forward(*a, **k)
    model.forward = spy
    rows = np.random.default_rng(0).integers(0, V, size=(4, T + 1))
    autocast = train.sample_autocast(torch.device("cpu"), torch.bfloat16)
    train.evaluate(model, rows, np.ones(V, dtype=np.int32), 2, torch.device("cpu"), autocast)
    assert seen == [(True, torch.bfloat16, False)] * 2  # two batches, in bf16, in eval mode
    assert model.training


def test_bits_per_byte_leave_out_padded_targets():
    """B3 (a padded target, -1, counted with the bytes of token 0), B4 (padded targets counted as tokens of the
    val loss). Val rows are never padded today (val_rows cuts a stream), so these pin evaluate()'s masking
    for whoever evaluates packed rows."""
    V, T = 50, 8
    model = GPT(GPTConfig.preset("cpu", "bov", n_layer=1, n_embd=16, n_head=2, vocab_size=V, block_size=T))
    torch.nn.init.zeros_(model.lm_head.weight)  # uniform: ln V nats on every target
    rows = np.random.default_rng(0).integers(1, V, size=(4, T + 1))
    rows[1, 5:] = -1  # a padded row: 4 targets of 8
    rows[3, 2:] = -1
    token_bytes = np.full(V, 3, dtype=np.int32)
    token_bytes[5::5] = 0  # zero-byte tokens, like the special ones
    token_bytes[0] = 7  # what a padded target is clamped to: counted, it would add 7 bytes
    r = train.evaluate(model, rows, token_bytes, 2, torch.device("cpu"), train.nullcontext())
    targets = rows[:, 1:][rows[:, 1:] >= 0]
    assert r["val_loss"] == pytest.approx(math.log(V))
    text = token_bytes[targets] > 0
    assert r["val_bpb"] == pytest.approx(text.sum() * math.log(V) / math.log(2) / token_bytes[targets].sum())


def test_each_epoch_packs_its_own_shuffle_of_the_documents():
    """D1 (the documents packed in corpus order every epoch, only the finished rows shuffled: every epoch holds
    the same rows, a short document always beside the same neighbours)."""
    loader = train.Batches([np.concatenate(random_docs(4, (1, 12)))], 0, 16, seed=0)
    def rows(epoch):
        ptr, segs = loader.plan(epoch)
        return sorted(tuple(map(tuple, segs[ptr[r]:ptr[r + 1]].tolist())) for r in range(len(ptr) - 1))
    assert rows(0) != rows(1)


def test_a_checkpoint_at_a_negative_step_is_refused(data_dir, tmp_path, monkeypatch):
    """C1 (`0 <=` dropped from the step check: a damaged step -1 resumed and trained one step past the plan)."""
    out = tmp_path / "run"
    args = [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2"]
    train.main(args)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["step"] = -1
    torch.save(ckpt, out / "ckpt.pt")
    monkeypatch.setattr(train, "load_data", None)  # refused before the data is loaded
    with pytest.raises(train.ConfigError, match=r"is at step -1, outside this run's 0\.\.2 iterations; it is damaged$"):
        train.main([*args, "--resume"])
    ckpt["step"], row = 1, ckpt["loader"]["row"]  # a damaged data position: numpy's seed error was a traceback
    for loader in ({"epoch": -1, "row": row}, {"epoch": 0.5, "row": row}, {"epoch": True, "row": row}, {"epoch": 0}):
        torch.save({**ckpt, "loader": loader}, out / "ckpt.pt")
        with pytest.raises(train.ConfigError, match=rf"is damaged \(its data position {re.escape(repr(loader))} is not an "
                                                    r"epoch and a row >= 0\)$"):
            train.main([*args, "--resume"])
    monkeypatch.undo()  # a row past its epoch's end: found once the data is loaded (an IndexError traceback at the step)
    torch.save({**ckpt, "loader": {"epoch": 0, "row": 10**9}}, out / "ckpt.pt")
    with pytest.raises(train.ConfigError, match=r"is damaged \(ValueError: its data position is row 1000000000 of an epoch "
                                                r"of \d+ rows\)$"):
        train.main([*args, "--resume"])


def test_the_plan_prints_its_numbers(capsys):
    """P1 (the plan's FLOPs from the iterations, not the tokens), P3 (tokens from 1e8 to 1e9 shown in millions),
    P4 (the dense parameters' short form from the matrix weights)."""
    train.main(["--size=paper_135m", "--variant=baseline", "--max_iters=200", "--dry_run", "--data_dir=/nonexistent"])
    out = capsys.readouterr().out
    assert "plan: paper_135m / baseline: 135,266,304 dense parameters (135.3M) + 0 in value tables; target layers none\n" in out
    # 759,693,312 FLOPs/token x 104,857,600 tokens = 7.966e16; 104,857,600 / 110.10M matrix weights = 0.952
    assert ("plan: --max_iters -> 200 iterations, 104,857,600 tokens (0.10B), 7.97e+16 FLOPs, tokens:params 0.952 "
            "(over the 110.10M matrix weights, Table 6's base)\n") in out


def test_the_plan_counts_tokens_over_all_ranks(data_dir):
    """P5 (tokens = iterations x total_batch_tokens x ranks: total_batch_tokens is a step's over all ranks already,
    so under torchrun the plan, and the epoch warning, would count each token once per rank)."""
    s, overrides = train.resolve_settings([*TINY, f"--data_dir={data_dir}", "--max_iters=3", "--total_batch_tokens=256",
                                           "--dry_run"])
    lines = []
    *_, iters, tokens, accum = train.plan(s, overrides, 2, lines.append)
    assert (iters, tokens, accum) == (3, 768, 1)
    assert any(l.startswith("plan: --max_iters -> 3 iterations, 768 tokens (0.00M)") for l in lines)


def test_the_default_cpu_run_stays_within_one_epoch_of_shakespeare():
    """E6 (the cpu size's budget or batch raised past Shakespeare's epoch: the default run, the README's, would train
    into a second epoch, which the paper's regime is not). test_data.test_shakespeare_default: more than 1M train tokens."""
    from model import VARIANTS
    for variant in filter(lambda v: builds("cpu", v), VARIANTS):  # a variant's own layer list may be past the cpu size's 6
        s, overrides = train.resolve_settings([f"--variant={variant}", "--data_dir=/nonexistent", "--dry_run"])
        *_, tokens, _ = train.plan(s, overrides, 1, lambda *a: None)
        assert 400_000 < tokens < 1_000_000, variant


def test_a_moved_project_with_data_prepared_again_is_told_so(data_dir, tmp_path, monkeypatch):
    """C7 (the run's relative --data_dir not compared with the checkpoint's: a project moved elsewhere, its data
    prepared again, was told it read other data than the checkpoint's old absolute path, not that the data in
    its own --data_dir was prepared again)."""
    monkeypatch.chdir(os.path.dirname(data_dir))
    out = tmp_path / "run"
    args = [*TINY, f"--data_dir={os.path.basename(data_dir)}", f"--out_dir={out}", "--max_iters=1"]
    train.main(args)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["data_dir"] = "/moved/away/" + os.path.basename(data_dir)  # where the project was
    ckpt["data_counts"] = dict(ckpt["data_counts"], train_tokens=5)
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(train.ConfigError, match=r"^--resume: the data in \S+ is not the data .* \(train_tokens 5 there"):
        train.main([*args, "--resume"])


def test_a_step_that_reads_one_row_of_the_next_epoch_is_warned_of(data_dir, tmp_path, capsys):
    """E7 (the warning only once the step has read more than one row of the new epoch): the crossing step here
    reads the last rows of the first epoch and a single row of the second."""
    meta = load_meta(data_dir)
    rows = train.Batches(load_tokens(data_dir, "train"), meta["bos_id"], 32, 3).rows_per_epoch()
    b = next(b for b in range(2, rows + 2) if rows % b == b - 1 and rows // b < 20)  # a few steps an epoch, not 179
    train.main([*TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", f"--max_iters={rows // b + 1}",
                f"--device_batch_size={b}", f"--total_batch_tokens={b * 32}", "--eval_interval=100000",
                "--log_interval=100000"])
    assert f"WARNING: step {rows // b + 1} starts epoch 2 of" in capsys.readouterr().out
