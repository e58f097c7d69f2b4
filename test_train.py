"""Tests of train.py: settings, the plan (Table 6), the schedule, the loader, bits per byte, a run's files, exact
resume after SIGKILL, two gloo ranks against one process, and the one-line refusals."""

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import train
from conftest import BYTE_TOKENIZER
from model import GPT, GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))
# a model whose step takes milliseconds: 2 layers of width 32, 4 rows of 32 tokens per step
TINY = ["--n_layer=2", "--n_embd=32", "--n_head=2", "--block_size=32", "--device_batch_size=4",
        "--total_batch_tokens=128", "--warmup_iters=2", "--eval_tokens=1024", "--seed=3", "--log_interval=1"]


def records(out_dir, kind):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


def config_file(name):
    return os.path.join(HERE, "config", f"{name}.py")


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """One tiny BoV run of 6 steps on the session's Shakespeare, evaluated every 3: (out_dir, its arguments)."""
    out = str(tmp_path_factory.mktemp("run") / "out")
    args = [*TINY, f"--data_dir={data_dir}", "--max_iters=6", "--eval_interval=3", f"--out_dir={out}"]
    train.main(args)
    return out, args


@pytest.fixture
def small_data(tmp_path):
    """A byte-level data folder: 12 short documents (332 tokens, 13 rows of 33) and one of 99 for validation."""
    ids = lambda texts: np.array([t for d in texts for t in [256, *d.encode()]], np.uint16)
    train_ids = ids([f"doc {i}: " + "to be or not " * (i % 4) for i in range(12)])
    val_ids = ids(["the val play, " * 7])
    train_ids.tofile(tmp_path / "train_0000.bin")
    val_ids.tofile(tmp_path / "val_0000.bin")
    np.save(tmp_path / "token_bytes.npy", np.array([1] * 256 + [0], np.int32))
    (tmp_path / "tokenizer.json").write_text(json.dumps(BYTE_TOKENIZER))
    meta = dict(vocab_size=257, bos_id=256, dtype="uint16", train_files=["train_0000.bin"],
                val_files=["val_0000.bin"], train_tokens=len(train_ids), val_tokens=len(val_ids))
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    return tmp_path

# ---------------------------------------------------------------------------- settings, plan, schedule


@pytest.mark.parametrize("size, variant, iters", [("paper_135m", "baseline", 3766), ("paper_135m", "bov", 3838),
                                                  ("paper_780m", "baseline", 7809), ("paper_780m", "bov", 7998)])
def test_the_dry_run_plans_table_6(size, variant, iters, tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main([config_file(size), f"--variant={variant}", "--dry_run", f"--data_dir={tmp_path}/none",
                       f"--out_dir={out}"]) is None
    assert f"plan: {iters:,} iterations of" in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.parametrize("world, accum", [(1, 16), (4, 4), (16, 1)])
def test_the_plan_splits_the_step_over_accumulation_and_ranks(world, accum):
    s = train.settings([config_file("paper_135m")])
    flops = GPT(GPTConfig.preset("paper_135m", "baseline"), device="meta").estimate_flops()
    assert train.plan(s, flops, 2048, world) == (3766, accum)
    assert train.plan({**s, "target_flops": 0.0, "target_tokens": 5242881}, flops, 2048, world) == (10, accum)
    assert train.plan({**s, "target_flops": 0.0, "max_iters": 7}, flops, 2048, world) == (7, accum)


def test_the_780m_config_gives_table_6s_rates():
    s = train.settings([config_file("paper_780m")])
    model = GPT(GPTConfig.preset(s["size"], "bov"), device="meta")
    muon, adamw = model.configure_optimizers(*(s[k] for k in ("matrix_lr", "embedding_lr", "unembedding_lr",
                                                                 "scalar_lr", "table_lr", "weight_decay")))
    assert muon.param_groups[0]["lr"] == pytest.approx(0.0283, abs=1e-4)
    assert muon.param_groups[0]["weight_decay"] == 0.0597
    assert [g["lr"] for g in adamw.param_groups] == pytest.approx([0.30, 0.008, 0.15, 0.707], abs=1e-3)


def test_settings_take_config_files_then_key_value(tmp_path):
    cfg = tmp_path / "short.py"
    cfg.write_text("max_iters = 20\nmatrix_lr = 0.01\nn_layer = 4\nvariant = 'bov'\n")
    s = train.settings([config_file("paper_135m"), str(cfg), "--matrix_lr=3", "--bov_layers=1,2",
                        "--variant=baseline", "--resume", "--eval_tokens=2e6"])
    assert (s["size"], s["variant"], s["data_dir"]) == ("paper_135m", "baseline", "data/climbmix")
    assert s["max_iters"] == 20 and s["target_flops"] == 0.0  # a budget replaces the one before it
    assert s["matrix_lr"] == 3.0 and type(s["matrix_lr"]) is float  # typed as the default
    assert s["eval_tokens"] == 2_000_000 and type(s["eval_tokens"]) is int
    assert (s["n_layer"], s["bov_layers"], s["resume"]) == (4, (1, 2), True)
    assert s["out_dir"] == os.path.join("out", "paper_135m_baseline")
    assert train.settings(["--target_tokens=5"])["target_flops"] == 0.0
    with pytest.raises(AssertionError, match="max_iters=2.5: expected int"):
        train.settings(["--max_iters=2.5"])


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_resolved_settings(flag, capsys):
    assert train.main([config_file("paper_780m"), "--eval_interval=7", flag]) is None
    out = capsys.readouterr().out
    assert "size = 'paper_780m'" in out and f"matrix_lr = {0.02 * 2 ** 0.5!r}" in out and "eval_interval = 7" in out


@pytest.mark.parametrize("step, iters, warmup, frac, lrm", [
    (0, 100, 10, 0.65, 0.1), (9, 100, 10, 0.65, 1.0), (34, 100, 10, 0.65, 1.0),  # warmup, then the peak
    (35, 100, 10, 0.65, 1.0), (36, 100, 10, 0.65, 0.05 + 0.95 * 64 / 65),       # the warmdown's first steps
    (99, 100, 10, 0.65, 0.05 + 0.95 / 65), (100, 100, 10, 0.65, 0.05),          # ... to final_lr_frac at iters
    (3, 5, 1, 0.5, 1.0), (4, 5, 1, 0.5, 0.525)])                                # round(2.5) = 2 warmdown steps
def test_the_schedules_corners(step, iters, warmup, frac, lrm):
    assert train.lr_multiplier(step, iters, warmup, frac, 0.05) == pytest.approx(lrm, abs=1e-12)

# ---------------------------------------------------------------------------- data and evaluation


def numbered_shards(lengths):
    """Two shards of documents of these lengths: each token is 1 + its global position, <|bos|> (0) starts each."""
    docs = np.split(np.arange(1, 1 + sum(lengths)), np.cumsum(lengths)[:-1])
    for d in docs:
        d[0] = 0
    return [np.concatenate(docs[:len(docs) // 2]), np.concatenate(docs[len(docs) // 2:])]


def test_the_loader_covers_every_target_once_per_epoch():
    lengths = np.random.default_rng(0).integers(1, 40, size=60).tolist() + [100, 17, 18, 50]  # row: 17 tokens
    shards = numbered_shards(lengths)
    loader = train.Loader(shards, 0, 16, seed=5)
    n = len(loader.ptr) - 1
    rows = loader.next_rows(n)
    targets = rows[:, 1:][rows[:, 1:] > 0]
    text = np.concatenate(shards)
    np.testing.assert_array_equal(np.sort(targets), text[text > 0])  # every token but bos, once
    assert max((r == 0).sum() for r in rows) > 1  # short documents share rows
    assert all(first == 0 or first in set(targets) for first in rows[:, 0])  # a row continues where one ended
    assert all((r[:(r >= 0).sum()] >= 0).all() for r in rows)  # padding only at the end
    assert (loader.epoch, loader.row) == (0, n)
    following = loader.next_rows(3)  # the next epoch: another order, and a restored state reads the same rows
    assert loader.epoch == 1 and not np.array_equal(following, rows[:3])
    again = train.Loader(shards, 0, 16, seed=5)
    again.load_state({"epoch": 0, "row": n})
    np.testing.assert_array_equal(again.next_rows(3), following)


class BosFavoured(torch.nn.Module):
    """Logits 0, but 2 on <|bos|> (256): a target costs L = ln(256 + e^2) nats, a <|bos|> target L - 2."""

    def forward(self, x):
        logits = torch.zeros(*x.shape, 257)
        logits[..., 256] = 2.0
        return logits, None


def test_bits_per_byte_against_a_hand_count():
    data = np.array([256, 65, 66, 200, 256, 67, 201, 68, 256, 69], np.uint16)
    rows = train.val_rows([data[:6], data[6:]], 4, 9)  # rows of 5 at stride 4, across the two shards
    assert rows.tolist() == [[256, 65, 66, 200, 256], [256, 67, 201, 68, 256]]
    token_bytes = torch.tensor([1] * 128 + [2] * 128 + [0])  # ids >= 128: 2 bytes; bos: 0
    r = train.evaluate(BosFavoured(), rows, token_bytes, batch_size=1)
    L = math.log(256 + math.exp(2))
    assert r["val_loss"] == pytest.approx((6 * L + 2 * (L - 2)) / 8, rel=1e-6)  # 8 targets, 2 of them bos
    assert r["val_bpb"] == pytest.approx(6 * L / math.log(2) / 8, rel=1e-6)   # 6 text targets of 8 bytes

# ---------------------------------------------------------------------------- a run


def test_a_run_writes_its_metrics_and_checkpoint(trained, data_dir):
    out, _ = trained
    config = records(out, "config")
    assert len(config) == 1 and (config[0]["variant"], config[0]["seed"], config[0]["n_layer"]) == ("bov", 3, 2)
    assert [r["step"] for r in records(out, "train")] == [1, 2, 3, 4, 5, 6]
    evals = records(out, "eval")
    assert [(r["step"], r["tokens"]) for r in evals] == [(0, 0), (3, 384), (6, 768)]
    shape = dict(n_layer=2, n_embd=32, n_head=2, block_size=32, vocab_size=512)
    assert evals[-1]["flops"] == 768 * GPT(GPTConfig.preset("cpu", "bov", **shape), "meta").estimate_flops()
    assert evals[0]["coefficients"] == {"1": {"gamma_v": 1.0}} and evals[-1]["coefficients"]["1"]["gamma_v"] != 1.0
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] and 0 < evals[-1]["val_bpb"] < evals[0]["val_bpb"]
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    with open(os.path.join(data_dir, "tokenizer.json")) as f:
        assert ckpt["tokenizer"] == json.load(f)
    assert ckpt["step"] == 6 and ckpt["config"]["data_dir"] == str(data_dir)
    assert {k: ckpt["model_config"][k] for k in shape} == shape  # GPTConfig fields as settings, the data's vocabulary
    model, _ = GPT.from_checkpoint(out)  # the final model: it scores the last evaluation again
    meta = json.loads((data_dir / "meta.json").read_text())
    val = train.val_rows([np.fromfile(data_dir / f, meta["dtype"]) for f in meta["val_files"]], 32, 1024)
    token_bytes = torch.from_numpy(np.load(data_dir / "token_bytes.npy"))
    assert train.evaluate(model, val, token_bytes, 4) == {k: evals[-1][k] for k in ("val_loss", "val_bpb")}


def test_a_run_past_one_epoch_warns(small_data, tmp_path, capsys):
    train.main([*TINY, f"--data_dir={small_data}", "--max_iters=4", "--eval_tokens=64", f"--out_dir={tmp_path}/o"])
    out = capsys.readouterr().out
    assert re.search(r"WARNING: 1\.\d\d epochs of .*the paper's regime is a single epoch", out)
    assert re.search(r"WARNING: step \d starts epoch 2 of .*single epoch", out)


def test_core_eval_runs_eval_py_on_the_checkpoint(small_data, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(train.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    out = str(tmp_path / "o")
    train.main([*TINY, f"--data_dir={small_data}", "--max_iters=1", "--eval_tokens=64", f"--out_dir={out}",
                "--core_eval", "--eval_bundle=/b"])
    assert calls == [[sys.executable, os.path.join(HERE, "eval.py"), "--ckpt", out, "--bundle", "/b"]]


def test_a_step_is_the_mean_over_its_targets_however_it_is_split(small_data, tmp_path, monkeypatch):
    """Rows hold different numbers of targets (padding): 4 micro-batches of a row give the gradient of one of 4."""
    grads = []
    def zero_grad(self, set_to_none=True):  # the step's gradients, as the optimizers saw them
        grads.append({n: p.grad.clone() for n, p in self.named_parameters()})
        torch.nn.Module.zero_grad(self, set_to_none)
    monkeypatch.setattr(GPT, "zero_grad", zero_grad)
    for b in (4, 1):
        train.main([*TINY, f"--data_dir={small_data}", "--max_iters=1", f"--device_batch_size={b}",
                    "--eval_tokens=32", f"--out_dir={tmp_path}/{b}"])
    assert records(tmp_path / "1", "train")[0]["loss"] == pytest.approx(records(tmp_path / "4", "train")[0]["loss"])
    assert all(torch.allclose(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-8) for n in grads[0])


def test_rng_states_survive_a_checkpoint(tmp_path):
    torch.save(train.rng_state(), tmp_path / "rng.pt")
    draw = lambda: (random.random(), np.random.rand(), torch.rand(1).item())
    first = draw()
    train.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draw() == first


def test_resume_after_sigkill_is_bit_exact(data_dir, tmp_path, capsys):
    args = [*TINY, f"--data_dir={data_dir}", "--max_iters=30", "--eval_interval=2"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    ckpt = os.path.join(cut, "ckpt.pt")
    proc = subprocess.Popen([sys.executable, "train.py", *args, f"--out_dir={cut}"], cwd=HERE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill_at_the_first_checkpoint():
        deadline = time.time() + 60
        while not os.path.exists(ckpt) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killer = threading.Thread(target=kill_at_the_first_checkpoint)
    killer.start()  # the uninterrupted run trains here meanwhile
    try:
        train.main([*args, f"--out_dir={full}"])
    finally:
        killer.join()
    logged = lambda out: dict(re.findall(r"^step (\d+)/30 \| loss ([\d.]+)", out, re.M))  # step -> smoothed loss
    full_log = logged(capsys.readouterr().out)
    killed_at = torch.load(ckpt, weights_only=True)["step"]
    assert 2 <= killed_at < 30, "the run finished before it was killed"
    train.main([*args, f"--out_dir={cut}", "--resume", "--log_interval=2"])  # a setting that may change
    out = capsys.readouterr().out
    assert f"resumed {ckpt} at step {killed_at}" in out
    assert logged(out) == {k: v for k, v in full_log.items() if int(k) > killed_at and int(k) % 2 == 0}
    a, b = (torch.load(os.path.join(d, "ckpt.pt"), weights_only=True) for d in (full, cut))
    assert a["step"] == b["step"] == 30 and a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert records(full, "eval")[-1]["val_loss"] == records(cut, "eval")[-1]["val_loss"]


def test_two_gloo_ranks_match_one_process(data_dir, tmp_path, capsys):
    args = [*TINY, f"--data_dir={data_dir}", "--max_iters=4", "--eval_interval=2", "--total_batch_tokens=512"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", *args, f"--out_dir={two}"], cwd=HERE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        train.main([*args, f"--out_dir={one}"])  # meanwhile
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.terminate()  # torchrun stops its ranks
            proc.communicate()
    assert proc.returncode == 0, stderr[-2000:]
    assert "4 x 32 x 4 accumulation x 1 ranks" in capsys.readouterr().out
    assert "4 x 32 x 2 accumulation x 2 ranks" in stdout and stdout.count("plan:") == 1  # rank 0 alone logs
    l1, l2 = ([r["loss"] for r in records(d, "train")] for d in (one, two))
    assert len(l1) == len(l2) == 4
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    np.testing.assert_allclose(records(one, "eval")[-1]["val_loss"], records(two, "eval")[-1]["val_loss"], rtol=1e-5)

def test_the_device_is_the_local_ranks_gpu_or_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert [train.pick_device(d, r) for d, r in (("auto", 0), ("cuda", 3), ("cuda:1", 0), ("cpu", 2))] == [
        torch.device("cuda:0"), torch.device("cuda:3"), torch.device("cuda:1"), torch.device("cpu")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train.pick_device("auto") == torch.device("cpu")


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("extra, message", [
    (["--data_dir=/none"], "no prepared data in /none (no meta.json); run `python prepare_data.py` first"),
    ([], "ckpt.pt exists: pass --resume to continue that run, or choose another --out_dir"),
    (["--resume", "--matrix_lr=0.03"], "ckpt.pt was trained with matrix_lr=0.02, this run has 0.03"),
    (["--resume", "--bov_layers=0"], "ckpt.pt was trained with bov_layers=None, this run has 0"),
    (["--vocab_size=65537"], "vocab_size 65537 is more than the data's uint16 token ids can hold"),
    (["--batch_size=8"], "unknown setting 'batch_size' in --batch_size=8; the settings are size, variant,"),
])
def test_refusals_are_one_line(trained, extra, message):
    out, args = trained
    with pytest.raises(SystemExit) as e:
        train.main([*args, *extra])
    assert message in e.value.code and "\n" not in e.value.code


def test_an_unknown_setting_in_a_config_file_names_the_known_ones(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("learning_rate = 0.1\n")
    with pytest.raises(SystemExit, match=rf"unknown setting 'learning_rate' in {cfg}; the settings are size, .*, "
                                         r"matrix_lr, .* and the GPTConfig fields vocab_size, .*bov_layers"):
        train.settings([str(cfg)])


def nan_from_step_3(monkeypatch):
    """The training loss (a sum) turns NaN at the third step."""
    real, sums = F.cross_entropy, []
    def cross_entropy(*a, **kw):
        sums.append(kw.get("reduction") == "sum")
        return real(*a, **kw) * (float("nan") if sum(sums) >= 3 and sums[-1] else 1.0)
    monkeypatch.setattr(train.F, "cross_entropy", cross_entropy)


@pytest.mark.parametrize("extra, message, saved", [
    ([], "the loss is nan at step 3; stopping (last good checkpoint: {ckpt})", 2),
    (["--embedding_lr=1e39", "--eval_interval=1"], "the val loss is nan at step 1; stopping (no checkpoint written)",
     None),
])
def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(extra, message, saved, data_dir, tmp_path,
                                                                     monkeypatch):
    if not extra:
        nan_from_step_3(monkeypatch)
    ckpt = tmp_path / "o" / "ckpt.pt"
    with pytest.raises(SystemExit) as e:
        train.main([*TINY, f"--data_dir={data_dir}", "--max_iters=6", "--eval_interval=2", f"--out_dir={tmp_path}/o",
                    *extra])
    assert e.value.code == message.format(ckpt=ckpt)
    assert (torch.load(ckpt, weights_only=True)["step"] if ckpt.exists() else None) == saved
