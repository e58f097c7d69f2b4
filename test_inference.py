"""Tests of sample.py and bench.py on a tiny checkpoint and tokenizer made here (CPU, seconds).
Run: python -m pytest -q test_inference.py"""

import errno
import json
import math
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import bench
import prepare_data
import sample
from conftest import finish
from model import GPT, GPTConfig, LIMITS

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 64
WORDS = ("the", "bank", "of", "values", "café", "naïve", "Zürich", "東京", "数据", "🚀", "—", "token", "table")
TINY = "n_layer=6,n_embd=48,n_head=4,vocab_size=97"


@pytest.fixture(autouse=True)
def one_thread():
    """Other jobs may share the cores; one thread avoids OpenMP threads waiting on each other."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A prepared-data dir with a 300-token BPE tokenizer and a BoV checkpoint (random weights, so
    every layer, the value tables included, changes the logits) -> (ckpt path, tokenizer, model)."""
    root = tmp_path_factory.mktemp("tiny")
    rng = random.Random(0)
    os.makedirs(root / "corpus")
    for i in range(6):
        with open(root / "corpus" / f"d{i}.txt", "w", encoding="utf-8") as f:
            f.write("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(20)))
    prepare_data.main(["--source", f"files:{root / 'corpus' / '*.txt'}", "--vocab_size", "300",
                       "--out_dir", str(root / "data"), "--val_tokens", "100"])
    tok = prepare_data.load_tokenizer(str(root / "data"))
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("cpu", "bov", n_layer=6, n_embd=48, n_head=4, vocab_size=tok.vocab_size, block_size=BLOCK))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 1 / math.sqrt(p.size(1)), generator=g)
    path = str(root / "ckpt.pt")
    model.save_checkpoint(path, data_dir=str(root / "data"), step=0)
    return path, tok, model.eval()


def run_sample(capsys, *args):
    """sample.main in-process -> (stdout, stderr)"""
    capsys.readouterr()
    sample.main([str(a) for a in args])
    return capsys.readouterr()


def greedy_text(model, tok, prompt_ids, n):
    """What sample.py must print at temperature 0: the prompt (without bos) and n greedy tokens."""
    out = model.generate(torch.tensor([prompt_ids]), n, temperature=0)[0].tolist()
    return tok.decode(out[1:] if out[0] == tok.bos_id else out) + "\n"


# ---------------------------------------------------------------------------- sample.py

def test_text_is_streamed_while_tokens_are_sampled(tiny, monkeypatch, capsys):
    path, tok, model = tiny
    events = []

    class Recorder:
        def write(self, s):
            events.append(("write", s))

        def flush(self):
            pass

    sample_next = GPT.sample_next
    monkeypatch.setattr(GPT, "sample_next", staticmethod(lambda *a, **k: (events.append(("sample", None)), sample_next(*a, **k))[1]))
    monkeypatch.setattr(sys, "stdout", Recorder())
    sample.main(["--ckpt", path, "--start", "the café", "--max_new_tokens", "24", "--temperature", "0"])
    kinds = [k for k, s in events if k == "sample" or s]
    first, last = kinds.index("sample"), len(kinds) - 1 - kinds[::-1].index("sample")
    assert kinds.count("sample") == 24
    assert kinds[first:last].count("write") >= 10  # text came out between sampling steps, not at the end
    text = "".join(s for k, s in events if k == "write")
    assert text == greedy_text(model, tok, [tok.bos_id] + tok.encode("the café"), 24)
    err = capsys.readouterr().err
    assert re.search(r"prefill \d+ tokens at [\d,.]+ tok/s; decode 23 tokens at [\d,.]+ tok/s", err)


def test_the_header_counts_the_cache_in_the_runs_dtype(tiny, capsys):
    """Mutant s02 (the header's bytes/token at kv_cache_bytes' bf16 default: a float32 run, the CPU's, showed half).
    The tiny bov model: 6 layers of d 48, V-free 4 and 5: (2 x 6 - 2) x 48 x itemsize + a 4-byte id per token."""
    path, _, model = tiny
    assert model.config.v_free_layers() == (4, 5) and model.config.n_embd == 48
    for dtype, itemsize in (("float32", 4), ("bfloat16", 2)):
        err = run_sample(capsys, "--ckpt", path, "--max_new_tokens", "1", "--temperature", "0", "--dtype", dtype).err
        assert f"layers without a V cache: 4, 5; KV cache {10 * 48 * itemsize + 4:,} bytes/token; torch.{dtype} on cpu" in err


class Written(list):
    """A stand-in for stdout that keeps what is written to it."""

    def write(self, s):
        self.append(s)

    def flush(self):
        pass


def test_a_character_split_over_tokens_is_written_once_whole(tiny):
    _, tok, _ = tiny
    written = Written()
    stream = sample.TextStream(tok, written)
    byte_ids = [tok.enc.encode_single_token(bytes([b])) for b in "東".encode()]  # 3 one-byte tokens
    for i in byte_ids[:2]:
        stream.write([i])
    assert "".join(written) == ""
    stream.write(byte_ids[2:])
    stream.write(tok.encode("x"))
    stream.close()
    assert written == ["東", "x", ""]


def test_same_seed_same_text_other_seed_other_text(tiny, capsys):
    path, _, _ = tiny
    args = ["--ckpt", path, "--start", "the bank", "--max_new_tokens", "30", "--temperature", "1", "--top_k", "0"]
    a = run_sample(capsys, *args, "--seed", "1").out
    b = run_sample(capsys, *args, "--seed", "1").out
    c = run_sample(capsys, *args, "--seed", "2").out
    assert a == b
    assert a != c
    assert a.startswith("the bank") and c.startswith("the bank")


def test_num_samples_are_separated_and_differ(tiny, capsys):
    path, _, _ = tiny
    out = run_sample(capsys, "--ckpt", path, "--max_new_tokens", "20", "--num_samples", "2", "--temperature", "1").out
    first, second = out.split(sample.SEPARATOR)
    assert first and second and first != second


def test_greedy_offloaded_tables_give_the_same_tokens(tiny, capsys, tmp_path):
    path, tok, model = tiny
    # 100 new tokens pass the context of 64, where the cache restarts from the last half block
    args = ["--ckpt", path, "--start", "values of the", "--max_new_tokens", "100", "--temperature", "0"]
    plain = run_sample(capsys, *args)
    offloaded = run_sample(capsys, *args, "--offload_tables")
    prompt = [tok.bos_id] + tok.encode("values of the")
    assert len(prompt) + 100 > BLOCK
    assert plain.out == offloaded.out == greedy_text(model, tok, prompt, 100)
    # every distinct id fed to the model crossed once, for each of the 2 tables (the last token is never fed)
    fed = model.generate(torch.tensor([prompt]), 100, temperature=0)[0, :-1]
    rows = int(re.search(r"offload: ([\d,]+) table rows fetched", offloaded.err).group(1).replace(",", ""))
    moved = int(re.search(r"([\d,]+) bytes moved", offloaded.err).group(1).replace(",", ""))
    assert rows == 2 * len(fed.unique())
    assert moved == rows * model.config.n_embd * 4
    assert "bytes moved host -> cpu (on the CPU the model is in host memory too: the same path runs, as a check)" in offloaded.err
    assert "offload" not in plain.err
    # each sample is a sequence of its own: its rows cross again, and the report says so
    twice = run_sample(capsys, *args, "--offload_tables", "--num_samples", "2")
    assert twice.out == plain.out + sample.SEPARATOR + plain.out
    assert f"offload: {2 * rows:,} table rows fetched (each sample fetches its own rows), {2 * moved:,} bytes moved" in twice.err
    base = GPT(GPTConfig.preset("cpu", "baseline", n_layer=2, n_embd=48, n_head=4, vocab_size=tok.vocab_size, block_size=BLOCK))
    base.save_checkpoint(str(tmp_path / "ckpt.pt"), data_dir=os.path.join(os.path.dirname(path), "data"), step=0)
    got = run_sample(capsys, "--ckpt", tmp_path / "ckpt.pt", "--max_new_tokens", "3", "--offload_tables")
    assert "sample.py: note: this model has no value tables; --offload_tables changes nothing" in got.err


def test_empty_prompt_starts_from_bos(tiny, capsys):
    path, tok, model = tiny
    res = run_sample(capsys, "--ckpt", path, "--max_new_tokens", "16", "--temperature", "0")
    assert res.out == greedy_text(model, tok, [tok.bos_id], 16)
    assert re.fullmatch(r"sample.py: prefill 1 token at [\d,.]+ tok/s; decode 15 tokens at [\d,.]+ tok/s", res.err.splitlines()[-1])


def test_prompt_from_a_file(tiny, tmp_path, capsys):
    path, tok, model = tiny
    (tmp_path / "p.txt").write_text("Zürich 🚀 table", encoding="utf-8")
    out = run_sample(capsys, "--ckpt", path, "--start", f"FILE:{tmp_path / 'p.txt'}", "--max_new_tokens", "8", "--temperature", "0").out
    assert out == greedy_text(model, tok, [tok.bos_id] + tok.encode("Zürich 🚀 table"), 8)
    (tmp_path / "line.txt").write_text("ROMEO:\n")  # a text file's last newline is part of the prompt
    out = run_sample(capsys, "--ckpt", path, "--start", f"FILE:{tmp_path / 'line.txt'}", "--max_new_tokens", "8", "--temperature", "0").out
    assert out == greedy_text(model, tok, [tok.bos_id] + tok.encode("ROMEO:\n"), 8)
    (tmp_path / "crlf.txt").write_bytes("ROMEO:\r\nWhat\rlight\r\n".encode())  # fed as in the file, as the text is trained
    assert sample.read_prompt(f"FILE:{tmp_path / 'crlf.txt'}") == "ROMEO:\r\nWhat\rlight\r\n"
    (tmp_path / "blank.txt").write_text("\n")  # whitespace is a prompt, not an empty file
    res = run_sample(capsys, "--ckpt", path, "--start", f"FILE:{tmp_path / 'blank.txt'}", "--max_new_tokens", "8", "--temperature", "0")
    assert res.out == greedy_text(model, tok, [tok.bos_id] + tok.encode("\n"), 8) and "empty" not in res.err
    (tmp_path / "empty.txt").write_text("")
    res = run_sample(capsys, "--ckpt", path, "--start", f"FILE:{tmp_path / 'empty.txt'}", "--max_new_tokens", "8", "--temperature", "0")
    assert res.out == greedy_text(model, tok, [tok.bos_id], 8)
    assert res.err.splitlines()[0] == f"sample.py: warning: the prompt file {tmp_path / 'empty.txt'} is empty; starting from <|bos|> alone"


def test_a_prompt_file_is_read_up_to_a_bound(tmp_path, monkeypatch):
    """FILE:/dev/zero (or any endless file) is refused in one line past PROMPT_FILE_LIMIT characters; it filled the
    memory until the kernel killed the process."""
    monkeypatch.setattr(sample, "PROMPT_FILE_LIMIT", 2 * 2**20)
    (tmp_path / "p.txt").write_text("é" * (2 * 2**20))  # characters, not bytes
    assert sample.read_prompt(f"FILE:{tmp_path / 'p.txt'}") == "é" * (2 * 2**20)
    for path in (tmp_path / "p2.txt", "/dev/zero"):
        if path != "/dev/zero":
            path.write_text("x" * (2 * 2**20 + 1))
        with pytest.raises(sample.SampleError, match=rf"^the prompt file {path} is over 2M characters; the model reads at "
                                                     "most its context: give the part to continue from$"):
            sample.read_prompt(f"FILE:{path}")


def test_too_long_prompt_is_cropped_to_the_context_with_a_warning(tiny, capsys):
    path, tok, model = tiny
    text = " ".join(WORDS * 8)
    ids = [tok.bos_id] + tok.encode(text)
    assert len(ids) > BLOCK
    res = run_sample(capsys, "--ckpt", path, "--start", text, "--max_new_tokens", "5", "--temperature", "0")
    assert f"the prompt has {len(ids)} tokens" in res.err and f"keeping <|bos|> and the last {BLOCK - 1}" in res.err
    assert res.out == greedy_text(model, tok, [tok.bos_id] + ids[-(BLOCK - 1):], 5)


def test_a_prompt_of_exactly_the_context_is_kept_whole(tiny, capsys):
    _, tok, _ = tiny
    ids = [tok.bos_id] + tok.encode(" ".join(WORDS * 8))
    text = tok.decode(ids[1:BLOCK])
    assert len([tok.bos_id] + tok.encode(text)) == BLOCK
    capsys.readouterr()
    assert sample.encode_prompt(tok, text, BLOCK) == [tok.bos_id] + tok.encode(text)
    assert capsys.readouterr().err == ""


def test_top_k_1_is_greedy(tiny, capsys):
    path, tok, model = tiny
    res = run_sample(capsys, "--ckpt", path, "--start", "the bank", "--max_new_tokens", "20", "--temperature", "1",
                     "--top_k", "1", "--seed", "3")
    assert res.out == greedy_text(model, tok, [tok.bos_id] + tok.encode("the bank"), 20)


def test_bfloat16_decodes_under_autocast_with_a_bfloat16_cache(tiny, capsys, monkeypatch):
    path, _, _ = tiny
    dtypes, new_cache = [], GPT.new_cache

    def spy(self, *args, **kwargs):
        cache = new_cache(self, *args, **kwargs)
        dtypes.append(cache.k[0].dtype)
        return cache
    monkeypatch.setattr(GPT, "new_cache", spy)
    res = run_sample(capsys, "--ckpt", path, "--start", "the bank", "--max_new_tokens", "5", "--temperature", "0",
                     "--dtype", "bfloat16", "--device", "cpu")
    assert "torch.bfloat16 on cpu" in res.err and dtypes and set(dtypes) == {torch.bfloat16}


def test_auto_dtype_is_bfloat16_only_where_the_gpu_has_it_in_hardware(monkeypatch):
    """--dtype auto: bfloat16 from compute capability 8 (Ampere) on, float16 before, asked of --device's own GPU (an
    H100 beside a V100 here); torch's is_bf16_supported() says yes for both (the V100 emulates bf16) and is not asked."""
    capability = {0: (9, 0), 1: (7, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability[torch.device(d).index or 0])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.version, "hip", None)
    got = {d: sample.resolve_dtype("auto", d) for d in ("cuda", "cuda:0", "cuda:1", "cpu", "mps")}
    assert got == {"cuda": torch.bfloat16, "cuda:0": torch.bfloat16, "cuda:1": torch.float16, "cpu": torch.float32,
                   "mps": torch.float32}
    assert sample.resolve_dtype("float32", "cuda:0") == torch.float32 and sample.resolve_dtype("bfloat16", "cpu") == torch.bfloat16


def test_missing_checkpoint_is_one_line_and_a_nonzero_exit(tmp_path, capsys):
    """In-process: a SystemExit whose code is a string is what Python prints, as the one line on stderr, before it
    exits 1 (sample.py's own command line: test_a_full_or_closed_stdout_is_one_line and others)."""
    with pytest.raises(SystemExit) as e:
        sample.main(["--ckpt", str(tmp_path / "nope.pt")])
    assert e.value.code == f"sample.py: error: no checkpoint at {tmp_path / 'nope.pt'}; `python train.py` writes one"
    assert capsys.readouterr() == ("", "")


def test_ctrl_c_while_loading_is_one_line(tiny, monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(sample, "load", interrupted)
    with pytest.raises(SystemExit) as e:
        sample.main(["--ckpt", tiny[0]])
    assert e.value.code == 130 and capsys.readouterr().err == "sample.py: interrupted\n"


def test_ctrl_c_while_generating_reports_the_finished_samples_and_exits_130(tiny, monkeypatch, capsys):
    """Ctrl-C in the second sample: the first stays on stdout with its speeds, and the exit status is a shell's 130."""
    sample_one = sample.sample_one
    calls = []

    def second_interrupted(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return sample_one(*args)
    monkeypatch.setattr(sample, "sample_one", second_interrupted)
    with pytest.raises(SystemExit) as e:
        sample.main(["--ckpt", tiny[0], "--num_samples", "3", "--max_new_tokens", "4", "--seed", "1"])
    res = capsys.readouterr()
    assert e.value.code == 130 and len(calls) == 2
    assert "sample.py: interrupted" in res.err and "decode 3 tokens at" in res.err  # 4 new tokens: 1 from the prefill, 3 decoded
    calls.clear()
    calls.append(1)  # now the first sample is the one interrupted
    with pytest.raises(SystemExit) as e:
        sample.main(["--ckpt", tiny[0], "--num_samples", "3", "--max_new_tokens", "4", "--seed", "1"])
    assert e.value.code == 130
    assert capsys.readouterr().err.splitlines()[-2:] == ["sample.py: interrupted", "sample.py: no sample finished, so no speeds are reported"]


def test_checkpoint_data_dir_not_here_says_pass_data_dir(tiny, tmp_path, capsys):
    """A checkpoint from elsewhere (its data folder missing here) is one line naming --data_dir;
    --data_dir then works."""
    path, tok, model = tiny
    moved = str(tmp_path / "moved.pt")
    model.save_checkpoint(moved, data_dir=str(tmp_path / "elsewhere" / "data"), step=0)
    with pytest.raises(SystemExit) as e:
        sample.main(["--ckpt", moved])
    assert e.value.code == (f"sample.py: error: {moved} was trained on the data in {tmp_path / 'elsewhere' / 'data'}, "
                            "which is not here; pass --data_dir")
    data = os.path.join(os.path.dirname(path), "data")
    out = run_sample(capsys, "--ckpt", moved, "--data_dir", data, "--max_new_tokens", "8", "--temperature", "0").out
    assert out == greedy_text(model, tok, [tok.bos_id], 8)


def test_a_tokenizer_other_than_the_trained_one_is_refused(tiny, tmp_path, capsys):
    """The checkpoint's tokenizer hash must match the data folder's (train.py records it)."""
    path, tok, model = tiny
    data = os.path.join(os.path.dirname(path), "data")
    for sha, ok in ((prepare_data.tokenizer_sha256(data), True), ("0" * 64, False)):
        ckpt = str(tmp_path / f"{ok}.pt")
        model.save_checkpoint(ckpt, data_dir=data, tokenizer_sha256=sha, step=0)
        if ok:
            assert run_sample(capsys, "--ckpt", ckpt, "--max_new_tokens", "4", "--temperature", "0").out == \
                greedy_text(model, tok, [tok.bos_id], 4)
        else:
            with pytest.raises(SystemExit) as e:
                sample.main(["--ckpt", ckpt])
            assert e.value.code == (f"sample.py: error: the tokenizer of {data} is not the one {ckpt} was trained with (its SHA-256 "
                                    f"differs: the folder was prepared again since, or is another); pass --data_dir with the data "
                                    f"it was trained on, or prepare that again (its vocabulary: {model.config.vocab_size} tokens)")


def test_a_closed_pipe_stops_sampling_quietly(tiny):
    """`python sample.py | head -c 5`: no traceback when the reader leaves."""
    path, _, _ = tiny
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "sample.py"), "--ckpt", path, "--max_new_tokens", "5000",
                          "--num_samples", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=HERE)
    p.stdout.read(5)
    p.stdout.close()  # later writes get EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err


def test_a_stdout_that_cannot_encode_the_text_shows_it_escaped(tiny, tmp_path):
    """PYTHONIOENCODING=ascii (or a C locale's terminal): the prompt's é is written as \\xe9, not a traceback; the
    same for train.py's log (a path in it)."""
    path, _, _ = tiny
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    runs = [subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=HERE,
                             env=env, text=True, encoding="utf-8")
            for script, args in (("sample.py", ["--ckpt", path, "--start", "épée", "--max_new_tokens", "2", "--temperature", "0"]),
                                 ("train.py", ["--dry_run", f"--data_dir={tmp_path / 'é'}"]))]
    (s_out, s_err), (t_out, t_err) = [p.communicate(timeout=120) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], s_err + t_err
    assert s_out.startswith("\\xe9p\\xe9e") and "Traceback" not in s_err
    assert f"note: {tmp_path}/\\xe9 is not prepared yet" in t_out and "Traceback" not in t_err


def test_compile_gives_the_eager_text_and_says_the_rates_include_compiling(tiny, monkeypatch, capsys):
    """--compile end to end, through dynamo only (inductor's C++ build would take minutes here)."""
    from torch._dynamo.utils import counters
    path, tok, model = tiny
    compile_ = GPT.compile
    monkeypatch.setattr(GPT, "compile", lambda self, **kw: compile_(self, backend="eager", **kw))
    counters.clear()
    try:
        out, err = run_sample(capsys, "--ckpt", path, "--max_new_tokens", 12, "--temperature", 0, "--compile")
    finally:
        torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] >= 2  # the prefill and the one-token step were compiled
    assert out == greedy_text(model, tok, [tok.bos_id], 12)
    assert re.search(r"decode 11 tokens at [\d.,]+ tok/s \(both include compiling\)$", err.strip())


def test_logits_that_are_not_finite_stop_sampling_in_one_line(tiny, tmp_path, capsys):
    """A checkpoint whose logits are NaN (diverged, or float16 past its range): one line, never NUL bytes from the
    argmax of NaN (greedy) nor multinomial's traceback (sampling)."""
    _, tok, model = tiny
    ckpt = torch.load(tiny[0], weights_only=True)
    ckpt["model"]["lm_head.weight"][5, 0] = float("nan")
    torch.save(ckpt, tmp_path / "nan.pt")
    for dtype, hint in (("float32", ""), ("float16", "; float16's range is 65504: sample with --dtype bfloat16 or float32")):
        for temperature in ("0", "1"):
            with pytest.raises(SystemExit) as e:
                run_sample(capsys, "--ckpt", tmp_path / "nan.pt", "--max_new_tokens", "3", "--temperature", temperature,
                           "--dtype", dtype)
            assert e.value.code == (f"sample.py: error: the model's logits are not finite (NaN or inf) at new token 1, "
                                    f"computed in torch.float32{hint}")  # (the soft-capped logits are float32)
            assert "\x00" not in capsys.readouterr().out


def test_a_failed_compile_is_one_line(tiny, monkeypatch):
    """--compile that fails at the first step (as with no working C++ compiler: test_train.py runs that for real)."""
    path, _, _ = tiny
    def broken_compile(self, **kw):
        def forward(*a, **k):
            raise torch._dynamo.exc.TorchDynamoException("InvalidCxxCompiler: No working C++ compiler found\nmore lines")
        self.forward = forward
    monkeypatch.setattr(GPT, "compile", broken_compile)
    with pytest.raises(SystemExit) as e:
        sample.main(["--ckpt", path, "--max_new_tokens", "3", "--compile"])
    assert e.value.code == ("sample.py: error: torch.compile failed (InvalidCxxCompiler: No working C++ compiler found); "
                            "run without --compile")
    with pytest.raises(SystemExit) as e:  # bench.py the same way
        bench.main(["--quick", "--config", TINY, "--contexts", "16", "--threads", "1", "--compile"])
    assert e.value.code == ("bench.py: error: torch.compile failed (InvalidCxxCompiler: No working C++ compiler found); "
                            "run without --compile")


def test_a_full_or_closed_stdout_is_one_line(tiny):
    path, _, _ = tiny
    cmd = [sys.executable, os.path.join(HERE, "sample.py"), "--ckpt", path, "--max_new_tokens", "5"]
    with open("/dev/full", "w") as full:  # both runs start at once: their torch imports overlap
        on_full = subprocess.Popen(cmd, stdout=full, stderr=subprocess.PIPE, text=True, cwd=HERE)
    closed = subprocess.Popen(cmd, stdout=None, stderr=subprocess.PIPE, text=True, cwd=HERE, close_fds=True,
                              preexec_fn=lambda: os.close(1))  # `python sample.py >&-`
    r = finish(on_full, 120)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == "sample.py: error: cannot write the text: No space left on device"
    assert "Traceback" not in r.stderr
    r = finish(closed, 120)
    assert r.returncode == 1 and r.stderr.strip() == "sample.py: error: stdout is closed; the text has nowhere to go"


@pytest.mark.parametrize("case", ["tokenizer", "prompt_file", "not_a_checkpoint", "not_utf8", "not_utf8_file"])
def test_other_bad_inputs_are_one_line_errors(tiny, tmp_path, case):
    path, _, _ = tiny
    if case == "tokenizer":
        args, expected = ["--ckpt", path, "--data_dir", str(tmp_path)], f"no prepared data in {tmp_path}"
    elif case == "prompt_file":
        args, expected = ["--ckpt", path, "--start", f"FILE:{tmp_path / 'none.txt'}"], "cannot read the prompt file"
    elif case == "not_utf8":  # a byte 0xff on the command line reaches sys.argv as the lone surrogate \udcff
        args, expected = ["--ckpt", path, "--start", b"ROMEO\xff".decode("utf-8", "surrogateescape")], \
            "--start is not UTF-8 text (surrogates not allowed at character 5)"
    elif case == "not_utf8_file":
        (tmp_path / "latin1.txt").write_bytes("Zürich".encode("latin-1"))
        args, expected = ["--ckpt", path, "--start", f"FILE:{tmp_path / 'latin1.txt'}"], \
            f"cannot read the prompt file {tmp_path / 'latin1.txt'}: 'utf-8' codec can't decode byte 0xfc"
    else:
        (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
        args, expected = ["--ckpt", str(tmp_path / "bad.pt")], "cannot read checkpoint"
    with pytest.raises(SystemExit) as e:
        sample.main(args)
    assert isinstance(e.value.code, str) and "\n" not in e.value.code
    assert e.value.code.startswith("sample.py: error: ") and expected in e.value.code


def test_bad_numbers_are_refused(tiny, capsys):
    path, _, _ = tiny
    for flag, value in (("--temperature", "-1"), ("--temperature", "inf"), ("--max_new_tokens", "-3"), ("--num_samples", "0"),
                        ("--seed", str(2 ** 64)), ("--seed", str(-2 ** 63 - 1))):
        with pytest.raises(SystemExit) as e:
            sample.main(["--ckpt", path, flag, value])
        assert e.value.code == 2 and f"{flag} must be" in capsys.readouterr().err


def test_no_new_tokens_and_tiny_temperatures(tiny, capsys):
    path, tok, model = tiny
    res = run_sample(capsys, "--ckpt", path, "--start", "the bank", "--max_new_tokens", "0")
    assert res.out == "the bank\n" and "no tokens generated, so no prefill or decode ran" in res.err
    res = run_sample(capsys, "--ckpt", path, "--start", "the bank", "--max_new_tokens", "6", "--temperature", "1e-40")
    assert res.out == greedy_text(model, tok, [tok.bos_id] + tok.encode("the bank"), 6)  # as greedy, not a crash
    assert sample.rate(1, 30.0) == "0.033 tok/s" and sample.rate(3000, 2.0) == "1,500.0 tok/s" and sample.rate(0, 1.0) == "n/a"


def test_an_id_past_the_tokenizer_is_written_as_a_replacement_character(tiny):
    """A model whose vocabulary is padded past the tokenizer's may sample an id the tokenizer does not have: it
    comes out as U+FFFD, one per id, and the text goes on."""
    _, tok, _ = tiny
    written = Written()
    stream = sample.TextStream(tok, written)
    stream.write([tok.vocab_size + 3])
    stream.write([tok.vocab_size, tok.vocab_size + 1] + tok.encode("x"))
    stream.close()
    assert "".join(written) == "\ufffd\ufffd\ufffdx"


def test_prefill_and_decode_times_are_split_at_the_first_token(tiny, monkeypatch):
    """The prefill's time runs to the first new token, the decode's from it to the last (a fake clock: the
    prefill takes 2 s, each later step 0.5 s)."""
    _, tok, _ = tiny
    now = [100.0]
    monkeypatch.setattr(sample, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    class Model:
        def stream(self, idx, n, *args, **kwargs):
            for step in range(n):
                now[0] += 2.0 if step == 0 else 0.5
                yield torch.tensor([[tok.encode("x")[0]]])

    args = sample.parse_args(["--max_new_tokens", "5", "--device", "cpu"])
    prompt = [tok.bos_id] + tok.encode("the bank")
    assert sample.sample_one(Model(), tok, prompt, args, None, Written()) == (len(prompt), 2.0, 4, 2.0)


def test_one_new_token_reports_the_prefill(tiny, capsys):
    """--max_new_tokens 1: the token comes out of the prefill, whose speed is reported; no decode step ran."""
    path, tok, model = tiny
    res = run_sample(capsys, "--ckpt", path, "--start", "the bank", "--max_new_tokens", "1", "--temperature", "0")
    assert res.out == greedy_text(model, tok, [tok.bos_id] + tok.encode("the bank"), 1)
    n = len([tok.bos_id] + tok.encode("the bank"))
    assert re.fullmatch(rf"sample.py: prefill {n} tokens at [\d,.]+ tok/s; decode 0 tokens at n/a", res.err.splitlines()[-1])


def test_text_cut_by_non_finite_logits_ends_its_line(tiny, tmp_path, capsys):
    """The prompt already written stays on a line of its own before the one-line error (a NaN from the first step)."""
    ckpt = torch.load(tiny[0], weights_only=True)
    ckpt["model"]["lm_head.weight"][5, 0] = float("nan")
    torch.save(ckpt, tmp_path / "nan.pt")
    with pytest.raises(SystemExit):
        run_sample(capsys, "--ckpt", tmp_path / "nan.pt", "--start", "the bank", "--max_new_tokens", "3", "--temperature", "0")
    assert capsys.readouterr().out == "the bank\n"


def test_nan_temperature_is_refused_and_the_seed_range_is_torchs(capsys):
    """--temperature nan would give NaN probabilities; the seeds torch.Generator takes, and only those, pass."""
    with pytest.raises(SystemExit) as e:
        sample.parse_args(["--temperature", "nan"])
    assert e.value.code == 2 and "--temperature must be a finite number >= 0 (0: greedy), not nan" in capsys.readouterr().err
    for seed in (-2 ** 63, 2 ** 64 - 1):
        assert sample.parse_args(["--seed", str(seed)]).seed == seed
        torch.Generator().manual_seed(seed)


def test_offloaded_tables_are_loaded_into_host_memory(tiny, monkeypatch):
    """With --offload_tables the checkpoint is loaded on the CPU and only then offloaded to --device, so that the
    tables never go to the device (checked with --device cuda as a name: nothing is moved here)."""
    path, _, _ = tiny
    loaded, offloaded, from_checkpoint = [], [], GPT.from_checkpoint
    monkeypatch.setattr(GPT, "from_checkpoint", classmethod(
        lambda cls, p, device="cpu": loaded.append(str(device)) or from_checkpoint.__func__(cls, p, "cpu")))
    monkeypatch.setattr(GPT, "offload_tables", lambda self, device: offloaded.append(str(device)) or self)
    sample.load(path, "cuda", offload_tables=True)
    sample.load(path, "cuda")
    assert loaded == ["cpu", "cuda"] and offloaded == ["cuda"]


# ---------------------------------------------------------------------------- bench.py

BENCH_ARGS = ["--quick", "--config", TINY, "--contexts", "16, 40", "--decode_batch", "2", "--json", "--threads", "1"]


@pytest.fixture(scope="module")
def bench_json():
    """One quick bench run of baseline vs bov on a tiny model, decoding 2 sequences at once, as JSON."""
    import contextlib
    import io
    out, threads = io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            bench.main(BENCH_ARGS)
    finally:
        torch.set_num_threads(threads)  # bench.main sets it for the whole process
    return json.loads(out.getvalue())


def test_bench_json_has_every_field(bench_json):
    assert shlex.split(bench_json["command"]) == ["python", "bench.py", *BENCH_ARGS]  # pasted into a shell, the same run
    r = bench_json
    assert r["variants"] == {"a": "baseline", "b": "bov"} and r["overrides"]["n_embd"] == 48
    rows = {(x["size"], x["variant"]): x for x in r["accounting"]}
    assert set(rows) == {(s, v) for s in ("paper_135m", "paper_780m", "cpu+config") for v in ("baseline", "bov")}
    for row in rows.values():
        assert row["dense_params"] > 0 and row["flops_per_token"] > 0
        assert (row["table_params"] > 0) == (row["variant"] == "bov")
    # the paper's token counts under its FLOPs budgets (Sections 3 and 5)
    assert round(rows["paper_135m", "baseline"]["budget_tokens"] / 1e9, 2) == 1.97
    assert round(rows["paper_780m", "baseline"]["budget_tokens"] / 1e9, 2) == 8.19
    assert round(rows["paper_780m", "bov"]["budget_tokens"] / 1e9, 2) == 8.39
    # the measured size's rows are --config's model: wte and lm_head 97 x 48, 12 d^2 of matrices a layer, two of
    # them BoV layers without W_V but with a gamma_v and a 97 x 48 table; no paper budget for it
    d, V = 48, 97
    assert (rows["cpu+config", "baseline"]["dense_params"], rows["cpu+config", "baseline"]["scaling_params"]) == (
        2 * V * d + 6 * 12 * d * d, V * d + 6 * 12 * d * d)
    assert (rows["cpu+config", "bov"]["dense_params"], rows["cpu+config", "bov"]["scaling_params"], rows["cpu+config", "bov"]["table_params"]) == (
        2 * V * d + 6 * 12 * d * d - 2 * d * d + 2, V * d + 6 * 12 * d * d - 2 * d * d, 2 * V * d)
    assert rows["cpu+config", "bov"]["budget_flops"] is rows["cpu+config", "bov"]["budget_tokens"] is None
    f = r["flops_measured"]
    for k in "ab":
        assert abs(f[k]["measured"] / f[k]["estimate"] - 1) < 0.02
    assert f["ratio"] == f["b"]["measured"] / f["a"]["measured"] < 1  # BoV runs no W_V matmul in its table layers
    s = r["speed"]
    assert s["compile"] is False and s["recompiled"] is None  # eager unless --compile
    for key in ("decode_tok_s", "prefill_tok_s"):
        assert set(s[key]) == {"16", "40"}
        for m in s[key].values():
            assert m["a"] > 0 and m["b"] > 0 and m["ratio"] > 0
    for m in (s["train_step_ms"], s["peak_bytes"]["decode"], s["peak_bytes"]["train_step"]):
        assert m["a"] > 0 and m["b"] > 0 and m["ratio"] > 0


def test_bench_cache_bytes_equal_the_analytic_figure(bench_json):
    c = bench_json["cache_allocated"]
    assert c["exact"] is True
    for k in "ab":
        assert c[k]["allocated"] == c[k]["analytic"] and c[k]["filled"] == 40 and c[k]["batch"] == 2
    # BoV keeps K in all 6 layers and V in 4, plus an int32 id per token: (12 - 2) / 12 + ids
    assert c["b"]["per_token"] == (2 * 6 - 2) * 48 * 4 + 4 and c["a"]["per_token"] == 2 * 6 * 48 * 4
    assert c["ratio_per_token"] == pytest.approx(c["ratio_expected"], rel=1e-12)


def test_bench_budgets_are_the_training_recipes():
    """bench.py's budgets (the tokens a budget buys) are the ones train.py and the config files train with."""
    import runpy
    import train
    for size, flops in bench.PAPER_BUDGETS.items():
        config = runpy.run_path(os.path.join(os.path.dirname(__file__), "config", f"{size}.py"))
        assert flops == train.SIZE_DEFAULTS[size]["target_flops"] == config["target_flops"]
        assert train.SIZE_DEFAULTS[size]["total_batch_tokens"] == config["total_batch_tokens"]


def test_bench_kv_memory_follows_eq6(bench_json):
    kv = bench_json["kv_cache"]["paper_780m"]
    L, d, V, s = 24, 1536, 32768, 2
    assert [row["context"] for row in kv["rows"]] == [1024, 4096, 16384, 65536, 262144, 1048576]  # 1K .. 1M
    for row in kv["rows"]:
        T = row["context"]
        assert row["eq6_bytes"] == L // 3 * d * (T - V) * s  # the paper's eq. 6, in bytes
        assert row["net_saving_seq"] == row["eq6_bytes"] - 4 * T  # less BoV's int32 id per token
        assert row["net_saving_batch"] == kv["batch"] * (row["seq_bytes_a"] - row["seq_bytes_b"]) - row["table_bytes_b"]
    assert kv["breakeven_paper"] == V and abs(kv["breakeven_tokens"] - V) < 8
    assert kv["breakeven_context_batch"] == pytest.approx(kv["breakeven_tokens"] / kv["batch"])
    # the shortest context at which BoV saves bytes, from the configs' own cache and table sizes
    a, b = GPTConfig.preset("paper_780m", "baseline"), GPTConfig.preset("paper_780m", "bov")
    net = lambda batch, T: batch * (a.kv_cache_bytes(1, T, torch.bfloat16) - b.kv_cache_bytes(1, T, torch.bfloat16)) - b.table_bytes(torch.bfloat16)
    for batch, first in ((1, kv["saves_from_context"]), (kv["batch"], kv["saves_from_context_batch"])):
        assert net(batch, first) > 0 >= net(batch, first - 1)
    lines = bench.report(bench_json).splitlines()
    line = next(l for l in lines[next(i for i, l in enumerate(lines) if "KV cache at size paper_780m" in l):] if "breakeven:" in l)
    assert line == (f"  breakeven: T = {kv['breakeven_tokens']:,.1f} tokens for one sequence (eq. 6: T = 32,768), B saves from "
                    f"T = {kv['saves_from_context']:,}; {kv['batch']} sequences sharing the tables: T = "
                    f"{kv['breakeven_context_batch']:,.1f} each ({kv['batch']} x T = {kv['breakeven_tokens']:,.1f}), B saves "
                    f"from T = {kv['saves_from_context_batch']:,}")


@pytest.mark.parametrize("a, b, paper, breakeven", [
    ("baseline", "bov_shared_table", 32768 // 4, 32768 / 4),  # one table for 4 V-free layers: eq. 6 at |V| / 4
    ("baseline", "svformer", None, 0),   # V1 replaces V: no table, so no breakeven to wait for
    ("bov_keep_v", "bov", None, 0),      # the same tables on both sides
    # B caches more per token but holds no tables: it saves below T = |V| (a little past it: A caches an int32 id a token)
    ("bov", "baseline", 32768, 32768 * 6144 / 6140),
    ("bov", "bov_shared_table", None, 0),  # the same cache, 1 table for 4: B saves from the first token
    ("bov", "svformer", None, 0),        # a smaller cache and no tables: B saves from the first token
    ("baseline", "t1_r09", None, None),  # the same cache, no tables on either side: nothing saved, ever
])
def test_bench_breakeven_of_other_pairs(bench_json, a, b, paper, breakeven):
    kv = bench.kv_memory(GPTConfig.preset("paper_135m", a), GPTConfig.preset("paper_135m", b), batch=32)
    assert kv["breakeven_paper"] == paper
    if breakeven is None or breakeven == 0:
        assert kv["breakeven_tokens"] == breakeven
        # nothing to wait for: B saves from the first token (at T = 0 it saves 0 bytes), or never
        assert kv["saves_from_context"] == kv["saves_from_context_batch"] == (1 if breakeven == 0 else None)
    else:
        assert abs(kv["breakeven_tokens"] - breakeven) < 8  # BoV's int32 id per token moves it slightly
    text = bench.report({**bench_json, "kv_cache": {"paper_135m": kv}})  # the table prints for every pair
    line = next(l for l in text.splitlines() if "breakeven:" in l)
    assert ("none needed" in line) == (breakeven == 0) and ("saves no cache" in line) == (breakeven is None)
    A, B = GPTConfig.preset("paper_135m", a), GPTConfig.preset("paper_135m", b)
    net = lambda n, T: n * (A.kv_cache_bytes(1, T, torch.bfloat16) - B.kv_cache_bytes(1, T, torch.bfloat16)) + \
        A.table_bytes(torch.bfloat16) - B.table_bytes(torch.bfloat16)
    for n, first, last in ((1, kv["saves_from_context"], kv["saves_until_context"]),
                           (32, kv["saves_from_context_batch"], kv["saves_until_context_batch"])):
        if first is not None:  # B saves from `first` (and not at the context before it, past the first token) ...
            assert net(n, first) > 0 and (first == 1 or net(n, first - 1) <= 0)
        if last is not None:  # ... up to `last`, and not beyond
            assert net(n, last) > 0 >= net(n, last + 1)
    if a == "bov" and b == "baseline":  # the baseline saves BoV's tables until its larger cache outgrows them
        assert (kv["saves_from_context"], kv["saves_until_context"], kv["saves_until_context_batch"]) == (1, 32789, 1024)
        assert line == ("  breakeven: T = 32,789.3 tokens for one sequence (eq. 6: T = 32,768), B saves up to T = 32,789; "
                        "32 sequences sharing the tables: T = 1,024.7 each (32 x T = 32,789.3), B saves up to T = 1,024")
    else:
        assert kv["saves_until_context"] is None and kv["saves_until_context_batch"] is None
    assert ("(eq. 6: T = " in line) == (paper is not None) and (paper is None or f"(eq. 6: T = {paper:,})" in line)


def test_a_batch_past_the_breakeven_saves_at_no_context():
    """B caching more per token but holding fewer table bytes saves below the breakeven; a batch that shares the
    tables can put it under one token a sequence, and then B saves at no context (not "up to T = 0")."""
    a, b = GPTConfig.preset("paper_135m", "bov"), GPTConfig.preset("paper_135m", "baseline")
    kv = bench.kv_memory(a, b, batch=40_000)  # 32,789.3 tokens: 0.82 a sequence
    assert kv["saves_from_context"] == 1 and kv["saves_until_context"] == 32789
    assert kv["saves_from_context_batch"] is None and kv["saves_until_context_batch"] is None
    line = next(l for l in bench.kv_lines("paper_135m", kv) if "breakeven:" in l)
    assert line.endswith("40000 sequences sharing the tables: T = 0.8 each (40000 x T = 32,789.3), B saves at no context")


def test_at_a_whole_breakeven_the_last_saving_context_is_one_before_it():
    """Mutant: the last context at which B saves taken as floor(root), which is the root itself when the root is a
    whole number, where B saves 0 bytes. BoV against the baseline, reversed, at d = 48 and |V| = 95 in float32:
    2 tables of 95 x 48 x 4 bytes over (2 x 48 x 4 - 4) bytes a token = 96 tokens exactly (48 each of 2)."""
    a, b = GPTConfig.preset("cpu", "bov", n_embd=48, vocab_size=95), GPTConfig.preset("cpu", "baseline", n_embd=48, vocab_size=95)
    kv = bench.kv_memory(a, b, batch=2, dtype=torch.float32)
    saving = lambda T: (a.kv_cache_bytes(1, T, torch.float32) + a.table_bytes(torch.float32)
                        - b.kv_cache_bytes(1, T, torch.float32) - b.table_bytes(torch.float32))
    assert (saving(95), saving(96)) == (380, 0) and kv["breakeven_tokens"] == 96
    assert kv["saves_until_context"] == 95 and kv["saves_until_context_batch"] == 47


def test_eq6_root_is_not_rounded():
    """eq. 6's root (tables added) |V| / (V-free layers added) is a fraction in general: one table shared by
    the 2 V-free layers of the cpu size at |V| = 97 breaks even at T = 48.5 (48.75 with BoV's id bytes)."""
    kv = bench.kv_memory(GPTConfig.preset("cpu", "baseline", vocab_size=97), GPTConfig.preset("cpu", "bov_shared_table", vocab_size=97), 1)
    assert kv["breakeven_paper"] == 48.5 and kv["breakeven_tokens"] == 97 * 192 * 2 / (2 * 192 * 2 - 4)  # 48.75
    assert "(eq. 6: T = 48.5)" in next(l for l in bench.kv_lines("cpu", kv) if "breakeven:" in l)


def test_eq6_bytes_count_the_tables_of_both_sides():
    """bov_shared_table against bov: the same cache, 3 of bov's 4 tables (|V| x d, bf16 by default) gone at every context."""
    a, b = GPTConfig.preset("paper_135m", "bov"), GPTConfig.preset("paper_135m", "bov_shared_table")
    for kv, s in ((bench.kv_memory(a, b, batch=1), 2), (bench.kv_memory(a, b, batch=1, dtype=torch.float32), 4)):
        for row in kv["rows"]:
            assert row["eq6_bytes"] == row["net_saving_seq"] == 3 * 32768 * 768 * s


def test_bench_budgets_only_for_the_papers_own_models():
    """A paper size changed by --config is not the model the paper's budget was spent on: no tokens for it."""
    rows = bench.accounting(["baseline"], {"paper_135m": ("paper_135m", {}), "paper_780m+config": ("paper_780m", {"n_layer": 12})})
    assert rows[0]["budget_flops"] == 1.5e18 and rows[0]["budget_tokens"] == 1.5e18 / rows[0]["flops_per_token"]
    assert rows[1]["budget_flops"] is rows[1]["budget_tokens"] is None


def test_bench_plot_without_matplotlib_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(SystemExit) as e:
        bench.main(["--plot", "--plot_dir", str(tmp_path / "plots"), "--quick"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "error: --plot needs matplotlib" in err[-1]  # after the usage lines
    assert not (tmp_path / "plots").exists()


def test_fig5a_draws_eq6_over_the_kv_cache_solid_and_over_the_v_cache_dashed(tmp_path, monkeypatch):
    """Solid: eq. 6 as a share of the K+V cache, 100 (n_bov / 2L)(1 - |V|/T), saturating at the paper's
    16.7 %; dashed: twice that, the share of the V cache (BoV's int32 id per token moves both by under 0.01
    percentage points at paper_780m)."""
    drawn = []
    monkeypatch.setattr(bench, "save", lambda fig, ax, *a, **k: drawn.append([(l.get_linestyle(), l.get_xdata(),
                                                                                 l.get_ydata()) for l in ax.lines]))
    bench.fig5a(str(tmp_path / "fig5a.png"))
    lines = drawn[0][:4]  # then the zero line
    assert [style for style, _, _ in lines] == ["-", "--", "-", "--"]
    for (_, T, kv), (_, T2, v), vocab in ((lines[0], lines[1], 32768), (lines[2], lines[3], 151936)):
        expected = 100 * (8 / 48) * (1 - vocab / np.asarray(T, dtype=float))
        np.testing.assert_allclose(kv, expected, rtol=0, atol=0.01)
        np.testing.assert_allclose(v, 2 * expected, rtol=0, atol=0.01)
    assert 16 < max(lines[0][2]) < 100 / 6


def test_an_interrupted_plot_keeps_the_previous_png(tmp_path, monkeypatch):
    import matplotlib.figure
    path = tmp_path / "fig5a.png"
    bench.fig5a(str(path))
    before = path.read_bytes()
    def half_then_interrupt(fig, f, **kw):  # Ctrl-C in the middle of writing the file
        f.write(before[:16])
        f.flush()
        raise KeyboardInterrupt
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        bench.fig5a(str(path))
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["fig5a.png"]


def test_bench_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def ctrl_c(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "run", ctrl_c)
    with pytest.raises(SystemExit) as e:
        bench.main(["--quick"])
    assert e.value.code == 130 and capsys.readouterr().err.splitlines()[-1] == "bench.py: interrupted"
    monkeypatch.setattr(bench, "pyplot", ctrl_c)  # while --plot's check imports matplotlib, before anything runs
    with pytest.raises(SystemExit) as e:
        bench.main(["--plot"])
    assert e.value.code == 130 and capsys.readouterr().err == "bench.py: interrupted\n"


def test_bench_speed_table_lines_up(bench_json):
    """Long labels (", batch 2") and long variant names keep the B/A column in one place."""
    for names in ((), ("value_embed_gated", "bov_shared_table")):
        r = dict(bench_json, variants=dict(zip("ab", names))) if names else bench_json
        lines = bench.report(r).split("Speed and memory")[1].splitlines()[2:]  # after its two lines of legend
        end = lines[0].index("B/A") + 3
        assert all(float(line[end - 7:end]) > 0 for line in lines[1:]) and len(lines) >= 6
        assert all(name in lines[0] for name in names)


def test_bench_decode_steps_take_turns():
    """A's and B's decode steps alternate, A B, B A, ..., after both prefilled: paired in time."""
    overrides = bench.parse_overrides(TINY)
    benches = [bench.Bench("cpu", v, overrides, 32, 1, "cpu", torch.float32) for v in ("baseline", "bov")]
    calls = []
    for k, b in enumerate(benches):
        b.step = (lambda k, step: lambda tok: (calls.append(k), step(tok))[1])(k, b.step)
    prefill, decode = bench.time_decode(benches, 32, 6, (1, 0))
    assert calls == [1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1]
    assert all(x > 0 for x in prefill + decode) and all(b.cache.pos == 32 for b in benches)


def test_bench_decode_casts_the_weights_to_bf16_once():
    """Under a bf16 autocast, the timed decode steps reuse autocast's bf16 copies of the weights, as sample.py's
    loop does: one autocast is held around them all (each step's own, entered and left, drops the copies, and
    every step would cast every Linear weight again; on a GPU, ~70 kernels a step at paper_135m)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    benches = [bench.Bench("cpu", v, bench.parse_overrides(TINY), 32, 1, "cpu", torch.bfloat16) for v in ("baseline", "bov")]
    weights = {p.data_ptr() for b in benches for p in b.decoder.parameters()}

    class WeightCasts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in weights:
                casts.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))
    counts = []
    for steps in (2, 8):
        casts = []
        with WeightCasts():
            bench.time_decode(benches, 32, steps, (0, 1))
        counts.append(len(casts))
    assert counts[0] > 0 and counts[1] == counts[0]  # the prefill's casts, none more for six more steps


def test_bench_config_overrides_and_quartiles():
    assert bench.parse_overrides("n_head=4, window_pattern=L") == dict(n_head=4, window_pattern="L")
    with pytest.raises(bench.BenchError, match=r"^--config: unknown field n_layers; did you mean n_layer\? the fields it "
                                               r"sets are vocab_size, n_layer, n_head, n_embd, block_size, window_pattern$"):
        bench.parse_overrides("n_layers=4")
    with pytest.raises(bench.BenchError, match=r"^--config: unknown field bov_layer; did you mean bov_layers\? "):
        bench.parse_overrides("bov_layer=4")  # a variant's field, which the next try then hears is not --config's
    for field in ("bov_layers=4", "value_mix=add", "shared_table=true"):  # they would make the baseline a variant too
        with pytest.raises(bench.BenchError, match=f"^--config sets the size both presets share; {field.split('=')[0]} is a variant's"):
            bench.parse_overrides("n_layer=6," + field)
    with pytest.raises(bench.BenchError, match="key=value pairs separated by commas, got '5'"):
        bench.parse_overrides("n_layer=6,5")
    assert bench.parse_overrides("n_layer=+6,window_pattern=--6,n_head=-2") == dict(n_layer=6, window_pattern="--6", n_head=-2)
    assert bench.parse_overrides("n_embd=1e3,n_layer=2.0,n_head=2.5,window_pattern=1e3") == dict(  # as train.py reads
        n_embd=1000, n_layer=2, n_head="2.5", window_pattern="1e3")  # an int field's whole numbers; 2.5 left to GPTConfig
    with pytest.raises(ValueError, match="shared_table must be True or False"):
        GPTConfig.preset("cpu", "bov", shared_table="False")  # a non-empty string must not count as True
    m = bench.paired([1.0, 1.0], [0.9, 1.1])  # two rounds: the quartiles stay within the data
    assert m["ratio_q1"] >= 0.9 and m["ratio_q3"] <= 1.1 and m["ratio"] == pytest.approx(1.0)


def two_evaluations(tmp_path):
    """A run's metrics.jsonl (tmp_path/bov/): evaluations at 0 and 200 tokens (val bpb 3.0, 2.5; gamma_v of layers 4
    and 5 at 1, 1 then 2.5, 7) around a train record."""
    metrics = tmp_path / "bov" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text("\n".join(json.dumps(r) for r in [
        {"type": "eval", "step": 0, "tokens": 0, "val_bpb": 3.0, "coefficients": {"4": {"gamma_v": 1.0}, "5": {"gamma_v": 1.0}}},
        {"type": "train", "step": 5, "tokens": 100, "loss": 2.0},
        {"type": "eval", "step": 10, "tokens": 200, "val_bpb": 2.5, "coefficients": {"4": {"gamma_v": 2.5}, "5": {"gamma_v": 7.0}}},
    ]) + "\n")
    return metrics


def test_bench_plots_and_metrics(tmp_path, capsys, monkeypatch):
    metrics = two_evaluations(tmp_path)
    # a full disk for stdout is one line: checked below, in a process started now (its torch and matplotlib
    # imports overlap the in-process plots), with a --plot_dir of its own
    with open("/dev/full", "w") as full:
        on_full = subprocess.Popen([sys.executable, "bench.py", "--plot", "--json", "--plot_dir", str(tmp_path / "plots_full"),
                                    str(metrics)], cwd=HERE, stdout=full, stderr=subprocess.PIPE, text=True)
    assert bench.read_metrics(str(metrics)) == [(0, 3.0), (200, 2.5)]
    bench.fig5a(str(tmp_path / "fig5a.png"))
    bench.val_curves([str(metrics)], str(tmp_path / "val.png"))
    assert (tmp_path / "fig5a.png").stat().st_size > 1000 and (tmp_path / "val.png").stat().st_size > 1000
    # metrics files given: plots only, no benchmark (fast), Fig 2 from the last evaluation's coefficients
    out = tmp_path / "plots"
    bench.main(["--plot", "--plot_dir", str(out), str(metrics)])
    assert sorted(p.name for p in out.iterdir()) == ["coefficients.png", "fig5a.png", "val_curves.png"]
    assert capsys.readouterr().out == ""
    bench.main(["--plot", "--json", "--plot_dir", str(out), str(metrics)])  # --json: the plots' paths on stdout
    assert json.loads(capsys.readouterr().out) == {"plots": [str(out / n) for n in ("fig5a.png", "val_curves.png", "coefficients.png")]}
    r = finish(on_full, 120)  # a full disk for stdout is one line
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == "bench.py: error: cannot write the results: No space left on device"
    baseline = tmp_path / "baseline" / "metrics.jsonl"
    baseline.parent.mkdir()
    baseline.write_text(json.dumps({"type": "eval", "step": 0, "tokens": 0, "val_bpb": 3.1, "coefficients": {}}) + "\n")
    assert not bench.coefficient_plot([str(baseline)], str(tmp_path / "none.png"))  # no target layers: no figure
    capsys.readouterr()
    bench.main(["--plot", "--plot_dir", str(out), str(baseline)])  # and an earlier --plot's figure goes, said so
    assert sorted(p.name for p in out.iterdir()) == ["fig5a.png", "val_curves.png"]
    assert "these runs have no learned coefficients: no coefficients.png" in capsys.readouterr().err
    mixed = tmp_path / "mixed" / "metrics.jsonl"  # a coefficient only some layers have
    mixed.parent.mkdir()
    mixed.write_text(json.dumps({"type": "eval", "step": 0, "tokens": 0, "val_bpb": 3.0,
                                 "coefficients": {"4": {"gamma_v": 1.0}, "5": {"alpha_v": 1.0, "beta_v": 0.5}}}) + "\n")
    assert bench.coefficient_plot([str(mixed)], str(tmp_path / "mixed.png")) and (tmp_path / "mixed.png").exists()
    import matplotlib.pyplot as plt  # the layer axis has whole-number ticks only
    drawn = []
    monkeypatch.setattr(bench, "save", lambda fig, ax, *a, **k: (drawn.append(list(ax.get_xticks())), plt.close(fig)))
    assert bench.coefficient_plot([str(metrics)], str(tmp_path / "ticks.png"))
    assert drawn and all(t == int(t) for t in drawn[0])
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SystemExit) as e:
        bench.main(["--plot", "--plot_dir", str(tmp_path), str(tmp_path / "bin.dat")])
    assert e.value.code == f"bench.py: error: metrics file {tmp_path / 'bin.dat'} is not UTF-8 text (train.py writes metrics.jsonl)"
    with pytest.raises(SystemExit) as e:  # read line by line, it never ended (a line of NULs as long as the memory)
        bench.main(["--plot", "--plot_dir", str(tmp_path), "/dev/zero"])
    assert e.value.code == "bench.py: error: metrics file /dev/zero is a device (train.py writes metrics.jsonl)"
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit) as e:  # into a new folder: none is left behind, empty
        bench.main(["--plot", "--plot_dir", str(tmp_path / "new" / "plots"), str(tmp_path / "bad.jsonl")])
    assert e.value.code.startswith(f"bench.py: error: {tmp_path / 'bad.jsonl'}:1: not JSON (")
    assert not (tmp_path / "new").exists()
    for bad, expected in (({"val_bpb": "2.5", "tokens": 0}, "are not finite numbers: '2.5'"),
                          ({"val_bpb": 2.5, "tokens": 0, "coefficients": {"4": 1.0}}, "coefficients are not"),
                          ({"val_bpb": 2.5, "tokens": 0, "coefficients": {"4": {"gamma_v": None}}}, "coefficients are not")):
        (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
        with pytest.raises(SystemExit) as e:
            bench.main(["--plot", "--plot_dir", str(tmp_path), str(tmp_path / "bad.jsonl")])
        assert e.value.code.startswith("bench.py: error: ") and expected in e.value.code and "\n" not in e.value.code


def test_bench_plot_labels_tell_runs_apart_and_a_failed_png_keeps_the_results(tmp_path, monkeypatch, capsys):
    """Two runs whose folders share a name (the same run at two commits) got the same legend label; a PNG that failed
    to write (a full disk) after the whole benchmark printed no results."""
    assert bench.run_names(["/a/out/cpu_bov/metrics.jsonl", "/b/out/cpu_bov/metrics.jsonl", "/a/out/cpu_baseline/m.jsonl"]) \
        == {"/a/out/cpu_bov/metrics.jsonl": "a/out/cpu_bov", "/b/out/cpu_bov/metrics.jsonl": "b/out/cpu_bov",
            "/a/out/cpu_baseline/m.jsonl": "cpu_baseline"}
    assert bench.run_names(["/x/m.jsonl", "/x/n.jsonl"]) == {"/x/m.jsonl": "/x/m.jsonl", "/x/n.jsonl": "/x/n.jsonl"}
    # folder names are shown as written: a pair of $ was read as maths (a crash, or "error: 5_to_"), a name not UTF-8
    # crashed matplotlib, and a leading _ hid the run from the legend
    runs = []
    for name in ("cost_$5_to_$10", "_try", os.fsdecode(b"o\xff")):
        runs.append(os.path.join(os.fsencode(tmp_path).decode(), name, "metrics.jsonl"))
        os.makedirs(os.path.dirname(runs[-1]))
        with open(runs[-1], "w") as f:
            f.write(json.dumps({"type": "eval", "step": 0, "tokens": 0, "val_bpb": 3.0,
                                "coefficients": {"4": {"gamma_v": 1.0}}}) + "\n")
    assert list(bench.run_names(runs).values()) == [r"cost_\$5_to_\$10", "\u200b_try", "o\ufffd"]
    legends, save = [], bench.save
    monkeypatch.setattr(bench, "save", lambda fig, ax, *a, **k: (save(fig, ax, *a, **k),
                                                                 legends.append([t.get_text() for t in ax.get_legend().get_texts()])))
    bench.val_curves(runs, str(tmp_path / "val.png"))
    assert bench.coefficient_plot(runs, str(tmp_path / "coefficients.png"))
    assert legends[0] == [r"cost_\$5_to_\$10", "\u200b_try", "o\ufffd"] and len(legends[1]) == 3
    assert (tmp_path / "val.png").stat().st_size > 1000 and (tmp_path / "coefficients.png").stat().st_size > 1000
    monkeypatch.setattr(bench, "save", save)
    monkeypatch.setattr(bench, "run", lambda args, log: {"speed": {}, "measured": 1.5})

    def full_disk(args, log):
        raise OSError(28, "No space left on device", str(tmp_path / "fig5a.png"))
    monkeypatch.setattr(bench, "draw_plots", full_disk)
    with pytest.raises(SystemExit) as e:
        bench.main(["--quick", "--json", "--plot", "--plot_dir", str(tmp_path)])
    assert json.loads(capsys.readouterr().out) == {"speed": {}, "measured": 1.5}  # printed before the error
    assert e.value.code == f"bench.py: error: {tmp_path / 'fig5a.png'}: No space left on device"


def test_bench_compile_compiles_every_graph_in_the_warm_up(monkeypatch, capsys):
    """--compile: both presets' decoders and train models are compiled, every graph in the warm-up round, none
    in the timed rounds (their timings would include compiling). Dynamo's eager backend keeps it fast here;
    the inductor run is in the README."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **k: real(*a, **{**k, "backend": "eager"}))
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters
    dynamo.reset()  # no graphs or limits from earlier tests
    threads, before = torch.get_num_threads(), counters["stats"]["unique_graphs"]
    limits = dynamo.config.recompile_limit, dynamo.config.fail_on_recompile_limit_hit
    try:
        bench.main(["--quick", "--config", "n_layer=3,n_embd=32,n_head=2,vocab_size=97,block_size=32", "--contexts", "16",
                    "--json", "--threads", "1", "--compile"])
    finally:
        torch.set_num_threads(threads)
        dynamo.config.recompile_limit, dynamo.config.fail_on_recompile_limit_hit = limits
        dynamo.reset()
    r = json.loads(capsys.readouterr().out)
    assert r["speed"]["compile"] is True and r["speed"]["recompiled"] == 0
    assert r["speed"]["peak_bytes"] is None  # on the CPU not measurable compiled: not reported as if it were
    assert counters["stats"]["unique_graphs"] - before >= 4  # prefill and step of each decoder at least, and the train steps
    assert "torch.compile'd, 1 round after a warm-up" in bench.report(r) and "WARNING" not in bench.report(r)
    assert "(peak memory not measured: on the CPU" in bench.report(r)
    r["speed"]["recompiled"] = 3
    assert "WARNING: 3 graphs were compiled after the warm-up" in bench.report(r)


def test_bench_size_follows_the_device_and_the_command_is_quoted(monkeypatch):
    """On a GPU box --device cpu measures the cpu size, not paper_135m; the recorded command can be pasted back."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench.parse_args(["--device", "cpu", "--threads", "1"]).size == "cpu"
    assert bench.parse_args(["--device", "cuda:1", "--threads", "1"]).size == "paper_135m"
    assert bench.parse_args(["--threads", "1"]).size == "paper_135m"  # the default device is then cuda
    assert bench.parse_args(["--device", "cuda", "--size", "cpu", "--threads", "1"]).size == "cpu"  # a --size given wins
    assert bench.parse_args(["--device", "cpu", "--size", "paper_780m", "--threads", "1"]).size == "paper_780m"


def test_bench_bad_arguments_are_one_line_errors(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--config", "n_layer=--6", "--threads", "1"])
    assert e.value.code == "bench.py: error: bad GPTConfig: n_layer must be a positive integer, got '--6' (size cpu, variant baseline)"
    with pytest.raises(SystemExit) as e:
        bench.main(["--variants", "baseline", "nope", "--threads", "1"])
    assert e.value.code.startswith("bench.py: error: unknown variant 'nope'") and "\n" not in e.value.code
    with pytest.raises(SystemExit) as e:
        bench.main(["--config", "n_embd", "--threads", "1"])
    assert "key=value" in e.value.code
    with pytest.raises(SystemExit) as e:
        bench.main(["--config", "=3", "--threads", "1"])
    assert e.value.code == "bench.py: error: --config takes key=value pairs separated by commas, got '=3'"
    with pytest.raises(SystemExit) as e:
        bench.main(["--contexts", "8", "--steps", "8"])
    assert e.value.code == 2 and "must exceed --steps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.main(["--threads", str(100 * os.cpu_count())])
    assert e.value.code == 2 and f"--threads must be at most the {os.cpu_count()} CPUs here" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # 2^40 prompts: more than any address space
        bench.main(["--quick", "--config", TINY, "--contexts", "16", "--decode_batch", str(2 ** 40), "--threads", "1"])
    assert e.value.code.startswith("bench.py: error: out of memory (") and e.value.code.endswith(
        "lower --decode_batch, --batch, the largest of --contexts, or the model (--size, --config)") and "\n" not in e.value.code
    with pytest.raises(SystemExit) as e:
        bench.main(["--contexts", ","])
    assert e.value.code == 2 and "--contexts needs at least one decode context" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # an OverflowError in the rotary tables, or torch's SymInt error, before
        bench.main(["--contexts", f"1024,{2**63 - 1}"])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --contexts: at most 16,777,216 (positions are float32 in the rotary tables, exact up to 2^24), "
        "got 9,223,372,036,854,775,807")
    with pytest.raises(SystemExit) as e:  # refused before the benchmark runs, not after
        bench.main(["--plot", "--plot_dir", os.path.join(HERE, "README.md", "plots")])
    assert e.value.code == 2 and "--plot_dir" in capsys.readouterr().err
    for device, why in (("nope", "not a device type torch knows"), ("xla", "this torch build has no xla backend"),
                        ("hpu", "this torch build has no hpu backend"),  # torch imports torch.hpu: ModuleNotFoundError
                        ("meta", "the meta device holds no data")):
        with pytest.raises(SystemExit) as e:
            bench.main(["--device", device, "--threads", "1"])
        assert e.value.code == f"bench.py: error: --device {device} is not usable here: {why}" + (
            " (cpu, cuda, cuda:N, mps, ...)" if device == "nope" else "")


# ---------------------------------------------------------------------------- sample timings, the benchmark's bookkeeping

def test_timings_count_every_sample(tiny, capsys):
    """Mutant S4 (sample.py main): `totals = list(sample_one(...))`, so only the last sample is counted."""
    path, tok, _ = tiny
    prompt = [tok.bos_id] + tok.encode("the bank")
    err = run_sample(capsys, "--ckpt", path, "--start", "the bank", "--num_samples", 3, "--max_new_tokens", 5,
                     "--temperature", 0).err
    assert f"prefill {3 * len(prompt)} tokens at" in err and "decode 12 tokens at" in err


def test_paired_gives_medians_and_quartiles_around_the_ratio():
    """Mutants B3 (ratio = mean of the ratios), B4 (q1 and q3 swapped), B5 (b = the median of a)."""
    m = bench.paired([1.0, 2.0, 4.0], [3.0, 6.0, 120.0])  # ratios 3, 3, 30
    assert (m["a"], m["b"], m["ratio"]) == (2.0, 6.0, 3.0)
    assert m["ratio_q1"] <= m["ratio"] <= m["ratio_q3"] and m["ratio_q1"] < m["ratio_q3"]


def test_measure_alternates_the_order_and_files_each_number_under_its_name(monkeypatch):
    """Mutants B1 (order always A B), B6 (prefill filed with the decode numbers), B8 (the train-step memory
    ratio taken from the decode memory)."""
    orders, trains = [], []

    def fake_time_decode(benches, context, steps, order):
        orders.append(tuple(order))
        return [1000.0, 3000.0], [10.0, 15.0]

    class Fake:
        def __init__(self, k):
            self.k = k

        def time_train_step(self):
            trains.append(self.k)
            return 10.0 * (self.k + 1)

        def memory(self, context, steps):
            return 100 * (self.k + 1), 1000 * (self.k + 1) ** 2

    monkeypatch.setattr(bench, "time_decode", fake_time_decode)
    out = bench.measure([Fake(0), Fake(1)], [16], 4, 3, lambda msg: None)
    assert set(orders) == {(0, 1), (1, 0)} and all(a != b for a, b in zip(orders, orders[1:]))  # A B, B A, ...
    assert [tuple(trains[i:i + 2]) for i in range(0, len(trains), 2)] == orders  # train steps in the same order
    assert out["prefill_tok_s"][16] == dict(a=1000.0, b=3000.0, ratio=3.0, ratio_q1=3.0, ratio_q3=3.0)
    assert out["decode_tok_s"][16]["ratio"] == 1.5 and out["train_step_ms"]["ratio"] == 2.0
    assert out["peak_bytes"]["decode"]["ratio"] == 2.0 and out["peak_bytes"]["train_step"]["ratio"] == 4.0


def test_time_decode_rates_count_the_prefilled_and_decoded_tokens():
    """Mutant B7 (time_decode): prefill tok/s counted over `context` tokens, not the context - steps prefilled."""
    class Fake:
        prompt, device, dtype = torch.zeros(2, 1), "cpu", torch.float32

        def timed(self, run, *args):
            return run(*args), 0.5

        def prefill(self, n):
            return "tok"

        def step(self, tok):
            return tok
    prefill, decode = bench.time_decode([Fake(), Fake()], 40, 4, (0, 1))
    assert prefill == [2 * 36 / 0.5] * 2 and decode == [2 * 4 / (4 * 0.5)] * 2


# from a mutation audit of bench.py (the audit's mutant IDs in the docstrings)

def test_measure_leaves_the_warm_up_round_out(monkeypatch):
    """B01 (no warm-up round: the first timed round pays for cold caches, or compiling), B02 and B03 (the
    warm-up's decode / train timings counted with the timed rounds)."""
    calls = {"decode": 0, "train": [0, 0]}

    def fake_time_decode(benches, context, steps, order):
        calls["decode"] += 1
        first = calls["decode"] == 1  # the warm-up: slow
        return [1.0, 1.0] if first else [1000.0, 3000.0], [1.0, 1.0] if first else [10.0, 15.0]

    class Fake:
        def __init__(self, k):
            self.k = k

        def time_train_step(self):
            calls["train"][self.k] += 1
            return 1e6 if calls["train"][self.k] == 1 else 10.0 * (self.k + 1)

        def memory(self, context, steps):
            return 1, 1

    monkeypatch.setattr(bench, "time_decode", fake_time_decode)
    out = bench.measure([Fake(0), Fake(1)], [16], 4, 3, lambda msg: None)
    assert calls == {"decode": 4, "train": [4, 4]}  # 3 rounds after one warm-up
    assert out["per_round"]["decode"]["16"] == ([10.0] * 3, [15.0] * 3)
    assert out["per_round"]["train_ms"] == ([10.0] * 3, [20.0] * 3)
    assert out["prefill_tok_s"][16]["a"] == 1000.0 and out["train_step_ms"]["ratio"] == 2.0


def test_cpu_peak_bytes_count_what_is_live_at_once():
    """B12 (a storage never freed: the peak is everything allocated), B13 (peak = the bytes live at the end)."""
    weights = torch.zeros(1000)  # 4,000 bytes that exist before

    def fn():
        a = torch.ones(2000)  # 8,000
        b = a * 2             # 8,000 more: the peak
        del a, b
        torch.ones(10)        # 40, after both are freed

    assert bench.peak_bytes("cpu", fn, lambda: [weights]) == 4000 + 8000 + 8000


def test_the_same_preset_twice_saves_nothing():
    """B10 (`extra_tables <= 0`: A against itself reported as "saves memory at every context")."""
    cfg = GPTConfig.preset("paper_135m", "bov")
    assert bench.kv_memory(cfg, cfg, batch=4)["breakeven_tokens"] is None


def test_a_plot_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    import matplotlib.figure
    png = str(tmp_path / "fig5a.png")
    def full_disk(fig, f, **kw):  # a write on a full disk names no file: atomic_write adds it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"type": "val", "step": 1, "tokens": 10, "val_bpb": 2.5}) + "\n")
    with pytest.raises(SystemExit) as e:  # given a metrics file, plots only
        bench.main(["--plot", "--plot_dir", str(tmp_path), str(tmp_path / "metrics.jsonl")])
    assert e.value.code == f"bench.py: error: {png}: No space left on device"  # not "[Errno 28] ..."


def test_sigterm_while_a_png_is_written_leaves_no_temporary(tmp_path):
    """$MPLBACKEND as a Jupyter kernel exports it, outside the notebook: matplotlib's import refuses it; the PNGs are
    Agg's anyway. Then, in the same process (a second one would cost another torch import): bench.py's SIGTERM is a
    SystemExit(143): atomic_write removes its half-written file (killed outright, it stayed)."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"type": "eval", "step": 1, "tokens": 10, "val_bpb": 2.5}) + "\n")
    env = dict(os.environ, MPLBACKEND="module://matplotlib_inline.backend_inline")
    script = ("import bench\n"
              "print(bench.pyplot().get_backend(), flush=True)\n"  # in a fresh process, matplotlib not yet imported
              "import matplotlib.figure, os, runpy, signal, sys, time\n"
              "def savefig(fig, f, **kw):\n"
              "    f.write(b'half')\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(5)\n"
              "matplotlib.figure.Figure.savefig = savefig\n"
              f"sys.argv = ['bench.py', '--plot', '--plot_dir', {str(tmp_path / 'plots')!r}, {str(tmp_path / 'metrics.jsonl')!r}]\n"
              f"runpy.run_path({os.path.join(HERE, 'bench.py')!r}, run_name='__main__')\n")
    r = finish(subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=HERE, env=env), 120)
    assert r.stdout.lower().splitlines()[:1] == ["agg"], (r.stdout, r.stderr[-500:])  # a notebook's $MPLBACKEND
    assert r.returncode == 143 and os.listdir(tmp_path / "plots") == [], r.stderr[-500:]


@pytest.mark.parametrize("parse, flag, value", [(sample.parse_args, "--num_sample", "2"), (bench.parse_args, "--round", "2"),
                                                (prepare_data.parse_args, "--vocab", "512")])
def test_a_shortened_flag_is_refused_not_guessed(parse, flag, value, capsys):
    """argparse would take --num_sample for --num_samples; train.py refuses near misses, so the others do too."""
    with pytest.raises(SystemExit) as e:
        parse([flag, value])
    assert e.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err


# a second mutation audit of bench.py: the surviving mutants each test kills are named in its docstring

@pytest.mark.parametrize("a, b", [("baseline", "bov"), ("bov", "bov_shared_table"), ("baseline", "bov_every_layer"),
                                  ("baseline", "svformer")])
def test_kv_memory_rows_and_breakeven_follow_the_configs_at_every_dtype_and_batch(a, b):
    """Mutants: net_saving_batch without A's tables; the per-token saving taken in bf16 whatever the dtype; the
    first saving context at round(T) + 1, not floor(T) + 1 (paper_135m's 32 sequences break even at T = 1024.67);
    KV_DTYPE float16 (the same bytes, but not the bfloat16 the table says)."""
    A, B = GPTConfig.preset("paper_135m", a), GPTConfig.preset("paper_135m", b)
    assert bench.kv_memory(A, B, batch=1)["dtype"] == "bfloat16"  # the default
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float32, "float32")):
        tab_a, tab_b = A.table_bytes(dtype), B.table_bytes(dtype)
        per_token = A.kv_cache_bytes(1, 1, dtype) - B.kv_cache_bytes(1, 1, dtype)
        net = lambda n, T: n * (A.kv_cache_bytes(1, T, dtype) - B.kv_cache_bytes(1, T, dtype)) + tab_a - tab_b
        for batch in (1, 7, 32):
            kv = bench.kv_memory(A, B, batch=batch, dtype=dtype)
            assert kv["dtype"] == name and kv["batch"] == batch
            for row in kv["rows"]:
                T = row["context"]
                assert (row["seq_bytes_a"], row["seq_bytes_b"]) == (A.kv_cache_bytes(1, T, dtype), B.kv_cache_bytes(1, T, dtype))
                assert (row["table_bytes_a"], row["table_bytes_b"]) == (tab_a, tab_b)
                assert row["net_saving_seq"] == net(1, T) and row["net_saving_batch"] == net(batch, T)
            if tab_b > tab_a:  # B pays for tables: a breakeven, where the cache it saves covers them
                assert per_token > 0 and kv["breakeven_tokens"] == pytest.approx((tab_b - tab_a) / per_token, rel=1e-12)
                for n, first in ((1, kv["saves_from_context"]), (batch, kv["saves_from_context_batch"])):
                    assert net(n, first) > 0 >= net(n, first - 1), (n, first)
            else:  # no table bytes added: B saves from the first token
                assert kv["breakeven_tokens"] == 0 and kv["saves_from_context"] == kv["saves_from_context_batch"] == 1
                assert net(1, 1) > 0 and net(batch, 1) > 0


def test_paired_ratio_is_the_median_of_the_per_round_ratios():
    """Mutants: ratio = median(B) / median(A) (test_paired_gives_medians_... has ratios 3, 3, 30: the two agree); the
    one-round branch taken for two rounds (quartiles collapsed onto the lower ratio)."""
    m = bench.paired([1.0, 2.0, 4.0, 8.0, 100.0], [2.0, 3.0, 6.0, 4.0, 10.0])  # ratios 2, 1.5, 1.5, 0.5, 0.1
    assert (m["a"], m["b"], m["ratio"]) == (4.0, 4.0, 1.5)  # the medians' ratio would be 1
    assert (m["ratio_q1"], m["ratio_q3"]) == (0.5, 1.5)  # inclusive quartiles: the 2nd and 4th of five
    m = bench.paired([1.0, 1.0], [0.9, 1.1])  # two rounds: a quarter and three quarters of the way
    assert m["ratio_q1"] == pytest.approx(0.95, rel=1e-12) and m["ratio_q3"] == pytest.approx(1.05, rel=1e-12)
    assert bench.paired([2.0], [3.0]) == dict(a=2.0, b=3.0, ratio=1.5, ratio_q1=1.5, ratio_q3=1.5)  # one round


def test_bench_report_kv_rows_name_contexts_and_bytes_in_binary_units(bench_json):
    """Mutants: context_name in thousands (1024 printed as 1024, not 1K); human() dividing by 1000; the batch
    columns printing one sequence's bytes. paper_780m, bf16: the baseline caches 2 x 24 x 1536 x 2 = 147,456
    bytes a token, BoV 40 x 1536 x 2 + 4 = 122,884, and its 8 tables take 8 x 32768 x 1536 x 2 bytes."""
    assert bench_json["kv_cache"]["paper_780m"]["batch"] == 32
    lines = bench.report(bench_json).splitlines()
    start = next(i for i, l in enumerate(lines) if "KV cache at size paper_780m" in l)
    rows = lines[start + 3:start + 9]  # after the title, breakeven and header lines
    assert rows[0] == f"  {'1K':>8} {'144.0 MiB':>11} {'120.0 MiB':>11} {'4.5 GiB':>11} {'3.8 GiB':>11} {'-744.0 MiB':>13} {'-128.0 KiB':>15}"
    assert rows[5] == f"  {'1M':>8} {'144.0 GiB':>11} {'120.0 GiB':>11} {'4.5 TiB':>11} {'3.8 TiB':>11} {'23.2 GiB':>13} {'767.1 GiB':>15}"
    assert [r.split()[0] for r in rows] == ["1K", "4K", "16K", "64K", "256K", "1M"]
    assert [bench.context_name(T) for T in (1000, 1024, 1536, 3 * 1024, 2 ** 20, 3 * 2 ** 20)] == ["1000", "1K", "1536", "3K", "1M", "3M"]
    assert [bench.human(n) for n in (1023, 1024, -1536, 5 * 2 ** 40, 2 ** 50)] == ["1023 B", "1.0 KiB", "-1.5 KiB", "5.0 TiB", "1024.0 TiB"]
    # the unit is picked on the number as printed: never "1024.0 KiB" or "1000.00K"
    assert [bench.human(n) for n in (1023.4, 1023.7, 1048575, 1048524, -(2 ** 30 - 1))] == \
        ["1023 B", "1.0 KiB", "1.0 MiB", "1023.9 KiB", "-1.0 GiB"]
    assert [bench.short(n) for n in (999, 999_994, 999_999, 1_971_234_567, 2.5e12)] == ["999", "999.99K", "1.00M", "1.97B", "2.50T"]


def test_cache_allocated_flags_a_mismatch_and_keeps_the_presets_block_size(bench_json, monkeypatch):
    """Mutants: `exact` as any() of the two presets; the report's == / != flipped; the decode model's
    block_size = the largest context, not at least the preset's own (cpu: 256)."""
    c = bench_json["cache_allocated"]
    assert c["a"]["max_len"] == c["b"]["max_len"] == 256  # --contexts 16,40 under the cpu size's 256
    benches = [bench.Bench("cpu", v, bench.parse_overrides(TINY), 32, 1, "cpu", torch.float32) for v in ("baseline", "bov")]
    assert benches[0].decode_cfg.block_size == 256 and benches[0].train_cfg.block_size == 256
    prefill = benches[1].prefill

    def prefill_one_byte_over(n):  # as if B's cache allocated a byte more than kv_cache_bytes says
        tok = prefill(n)
        real = benches[1].cache.nbytes()
        monkeypatch.setattr(benches[1].cache, "nbytes", lambda: real + 1, raising=False)
        return tok
    benches[1].prefill = prefill_one_byte_over
    c = bench.cache_allocated(benches, 32)
    assert c["exact"] is False and c["a"]["allocated"] == c["a"]["analytic"] and c["b"]["allocated"] == c["b"]["analytic"] + 1
    lines = bench.report({**bench_json, "cache_allocated": c}).splitlines()
    cache = lines[next(i for i, l in enumerate(lines) if l.startswith("Decode cache allocated")) + 1:][:2]
    assert "bytes == analytic" in cache[0] and cache[0].split()[0] == "baseline"
    assert "bytes != analytic" in cache[1] and cache[1].split()[0] == "bov"


def test_cache_allocated_expects_ids_only_where_the_cache_keeps_them():
    """Mutant b03 (bench's own formula adds the 4 id bytes for any model with tables: a false "expected" for
    bov_keep_v and value_embed_gated, whose tables are added to a V that the cache keeps, and no ids). Per position,
    6 layers of d 48 in float32: K and V in all 6 (2,304 bytes), or in 6 and 4 (1,920) with layers 4, 5 V-free."""
    tiny_bench = lambda variant: bench.Bench("cpu", variant, bench.parse_overrides(TINY), 16, 1, "cpu", torch.float32)
    base = tiny_bench("baseline")
    for b, per_token in (("bov_keep_v", 2304), ("value_embed_gated", 2304), ("t1_r06", 1920), ("bov", 1924)):
        c = bench.cache_allocated([base, tiny_bench(b)], 16)
        assert c["a"]["per_token"] == c["a"]["per_token_expected"] == 2304, b
        assert c["b"]["per_token"] == c["b"]["per_token_expected"] == per_token, b
        assert c["ratio_per_token"] == c["ratio_expected"] and c["exact"], b


def test_measured_flops_off_the_estimate_are_flagged(bench_json):
    """At window_pattern L the counter's FLOPs are estimate_flops' to the unit; a new mechanism's matrix missed by
    the estimate shows as a ratio != 1, which the report flags."""
    f = bench_json["flops_measured"]
    assert all(f[k]["measured"] == f[k]["estimate"] for k in "ab")
    lines = [l for l in bench.report(bench_json).splitlines() if "measured/estimate" in l]
    assert len(lines) == 2 and not any("!= 1" in l for l in lines)
    off = dict(f, b=dict(f["b"], measured=f["b"]["estimate"] * 1.0183))
    lines = [l for l in bench.report({**bench_json, "flops_measured": off}).splitlines() if "measured/estimate" in l]
    assert "!= 1" not in lines[0] and lines[1].split()[0] == "bov" and \
        lines[1].endswith("measured/estimate 1.0183   != 1: estimate_flops misses a matrix applied twice or counts one "
                          'never applied (README "A new mechanism")')


def test_bench_refuses_zero_counts_and_metrics_without_plot_and_has_its_documented_defaults(capsys):
    """Mutants: the `< 1` refusals as `< 0` (--steps 0 dies in time_decode on 0 / 0.0, a traceback); metrics files
    accepted without --plot (and silently ignored); --serve_batch's default 32 changed."""
    for k in ("steps", "rounds", "batch", "decode_batch", "serve_batch", "threads"):
        with pytest.raises(SystemExit) as e:
            bench.parse_args([f"--{k}", "0"] + ["--threads", "1"] * (k != "threads"))
        assert e.value.code == 2 and f"--{k} must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["out/cpu_bov/metrics.jsonl", "--threads", "1"])
    assert e.value.code == 2 and "metrics files are read for --plot only" in capsys.readouterr().err
    args = bench.parse_args(["--threads", "1"])
    assert (args.steps, args.rounds, args.batch, args.decode_batch, args.serve_batch) == (32, 7, 8, 1, 32)
    assert args.contexts == [128, 1024, 4096] and args.variants == ["baseline", "bov"]
    args = bench.parse_args(["--quick", "--rounds", "3", "--contexts", "40,16,40", "--threads", "1"])
    assert (args.steps, args.rounds, args.batch) == (4, 3, 2) and args.contexts == [16, 40]  # sorted, once each


def test_run_measures_the_configured_paper_size_and_counts_flops_over_the_train_block(monkeypatch):
    """Mutants: the paper sizes' own configs overriding --config's when --size names a paper size (the accounting
    and KV tables would show the paper's model and its budget, not the one measured); the FLOPs' token count taken
    from the decode model's block_size (here the largest context, 100) rather than the train step's (64)."""
    monkeypatch.setattr(bench, "measure", lambda *a, **k: {})  # the speed runs: not needed here
    argv = ["--size", "paper_135m", "--config", TINY + ",block_size=64", "--contexts", "100", "--quick", "--threads", "1"]
    args = bench.parse_args(argv)
    args.argv = argv
    r = bench.run(args, lambda msg: None)
    rows = {(x["size"], x["variant"]): x for x in r["accounting"]}
    d, V = 48, 97
    assert rows["paper_135m+config", "baseline"]["dense_params"] == 2 * V * d + 6 * 12 * d * d  # --config's model
    assert rows["paper_135m+config", "baseline"]["budget_tokens"] is None
    # the paper's own 135M model is still there, as published (a reviewer found it replaced, under its label)
    assert rows["paper_135m", "baseline"]["budget_tokens"] > 0 and rows["paper_780m", "baseline"]["budget_tokens"] > 0
    assert r["kv_cache"]["paper_135m+config"]["rows"][0]["seq_bytes_a"] == 2 * 6 * d * 2 * 1024
    assert r["kv_cache"]["paper_135m"]["rows"][0]["seq_bytes_a"] == 2 * 12 * 768 * 2 * 1024
    assert r["kv_cache"]["paper_780m"]["rows"][0]["seq_bytes_a"] == 2 * 24 * 1536 * 2 * 1024
    assert r["flops_measured"]["tokens"] == 64 and r["cache_allocated"]["a"]["max_len"] == 100
    assert r["speed"]["train_block_size"] == 64


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_cpu_runs_keep_the_memory_a_step_frees(monkeypatch):
    """glibc hands a freed block past its mmap threshold back to the kernel, and the next allocation faults
    every page in again (a fifth of a CPU train step at the cpu size); keep_freed_memory stops that, on the
    CPU only, and bench.py sets it (train.py: test_train's own test)."""
    assert sample.keep_freed_memory("meta") is False and sample.keep_freed_memory("cuda") is False
    # in a fresh process, through malloc itself (torch's CPU tensors come from it): a 64 MiB block written and
    # freed 8 times, without (the control), then with. glibc maps it anew each time (past its mmap threshold's
    # 32 MiB cap, which the control's frees leave as it was), or, with mmap off alone, hands it back as soon as it
    # is freed (trimming the heap's top). One process for both: a second would cost another torch import.
    code = """if 1:
        import ctypes, resource, sys, sample
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
        faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        def rounds():
            counts = []
            for _ in range(8):
                before = faults()
                block = libc.malloc(64 << 20)
                ctypes.memset(block, 1, 64 << 20)
                libc.free(block)
                counts.append(faults() - before)
            return counts
        control = rounds()
        print(sample.keep_freed_memory("cpu"))
        print(rounds())
        print(control)"""
    out = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kept, counts, control = out.stdout.splitlines()
    counts, control = json.loads(counts), json.loads(control)
    assert kept == "True"
    assert min(control[1:]) > 0 and sum(counts[1:]) < min(control[1:]), out.stdout  # faulted in at every round, or once
    seen = []  # recorded, not set in this process
    monkeypatch.setattr(bench, "keep_freed_memory", seen.append)
    monkeypatch.setattr(bench, "measure", lambda *a, **k: {})  # the speed runs: not needed here
    argv = ["--config", TINY, "--contexts", "40", "--quick", "--threads", "1", "--device", "cpu"]
    args = bench.parse_args(argv)
    args.argv = argv
    bench.run(args, lambda msg: None)
    assert seen == ["cpu"]


# ---------------------------------------------------------------------------- from a third hand mutation run

def test_bench_report_puts_each_preset_in_its_column_and_the_quartiles_after_the_ratio(bench_json):
    """Mutants (hand mutation, round 3): A and B swapped in the speed table; quartiles printed q1-q1; the prefill row
    naming the context instead of the tokens prefilled (context - steps)."""
    r = json.loads(json.dumps(bench_json))
    s = r["speed"]  # BENCH_ARGS: --quick (4 steps), --decode_batch 2, contexts 16 and 40
    s["prefill_tok_s"] = {"16": dict(a=1111.0, b=2222.0, ratio=1.9, ratio_q1=1.8, ratio_q3=2.1),
                          "40": dict(a=3333.0, b=4444.0, ratio=1.3, ratio_q1=1.2, ratio_q3=1.4)}
    s["train_step_ms"] = dict(a=10.0, b=20.0, ratio=2.0, ratio_q1=1.5, ratio_q3=2.5)
    text = bench.report(r)
    # the prefill row names the tokens prefilled (context - steps), A's median under A, B's under B, then the quartiles
    assert re.search(r"^  prefill tok/s, 12 tokens, batch 2 +1,111 +2,222 +1\.900  1\.800-2\.100$", text, re.M), text
    assert re.search(r"^  prefill tok/s, 36 tokens, batch 2 +3,333 +4,444 +1\.300  1\.200-1\.400$", text, re.M), text
    assert re.search(r"^  train step ms \(2x\d+\) +10\.0 +20\.0 +2\.000  1\.500-2\.500$", text, re.M), text


def test_bench_kv_header_gives_each_presets_own_table_bytes(bench_json):
    """Mutant: the KV header's "value tables: A ..." showing B's bytes."""
    kv = bench_json["kv_cache"]["paper_780m"]
    text = bench.report(bench_json)
    tab_b = 8 * 32768 * 1536 * 2  # BoV: a table in each of the last 8 of 24 layers, |V| x d bfloat16
    assert kv["rows"][0]["table_bytes_a"] == 0 and kv["rows"][0]["table_bytes_b"] == tab_b
    assert "KV cache at size paper_780m (bfloat16, batch 32); value tables: A 0 B, B 768.0 MiB (one copy" in text


def test_bench_plots_draw_val_bpb_against_tokens_and_the_last_evaluations_coefficients(tmp_path, monkeypatch):
    """Mutants: the val curves drawn with x and y swapped; Fig 2 from the first evaluation's coefficients."""
    metrics = two_evaluations(tmp_path)
    plt = bench.pyplot()
    drawn = {}

    def save(fig, ax, path, *a, **k):
        drawn[os.path.basename(path)] = [(l.get_label(), [float(x) for x in l.get_xdata()], [float(y) for y in l.get_ydata()])
                                         for l in ax.lines if not l.get_label().startswith("_")]  # not the axhline
        plt.close(fig)
    monkeypatch.setattr(bench, "save", save)
    bench.val_curves([str(metrics)], str(tmp_path / "val.png"))
    assert drawn["val.png"] == [("bov", [0.0, 200.0], [3.0, 2.5])]  # x: training tokens, y: val bpb
    assert bench.coefficient_plot([str(metrics)], str(tmp_path / "coef.png"))
    assert drawn["coef.png"] == [("bov: gamma_v", [4.0, 5.0], [2.5, 7.0])]  # the last evaluation's, not the first


def test_bench_contexts_up_to_the_block_size_limit_are_accepted():
    """Mutant: --contexts refusing the limit itself (`>=` for `>`)."""
    limit = LIMITS["block_size"][0]
    assert bench.parse_args(["--contexts", f"128,{limit}", "--threads", "1"]).contexts == [128, limit]
    with pytest.raises(SystemExit):
        bench.parse_args(["--contexts", str(limit + 1), "--threads", "1"])


def test_cuda_peak_bytes_are_the_tensors_own_plus_what_fn_adds_on_top(monkeypatch):
    """On CUDA the peak is the listed tensors' storages (each once) plus the allocator's peak over what was allocated
    before fn(): the other preset's model, also on the device, is not counted."""
    w = torch.zeros(1000)  # 4000 bytes; w[:10] shares its storage
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 10_000)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 10_500)
    assert bench.peak_bytes("cuda", lambda: calls.append("fn"), lambda: [w, w[:10]]) == 4000 + 500
    assert calls == ["reset", "fn"]


def test_a_tokenizer_larger_than_the_model_is_refused(tiny):
    """Mutant: sample.py's check that the model covers every token id of its tokenizer disabled."""
    path, tok, _ = tiny
    data_dir = os.path.join(os.path.dirname(path), "data")
    assert sample.checkpoint_tokenizer(path, {"data_dir": data_dir}, tok.vocab_size).vocab_size == tok.vocab_size
    with pytest.raises(sample.DataError, match=rf"^the tokenizer of .* has {tok.vocab_size} tokens, the model only {tok.vocab_size - 1}$"):
        sample.checkpoint_tokenizer(path, {"data_dir": data_dir}, tok.vocab_size - 1)


def test_one_offloaded_sample_reports_its_rows_without_the_each_sample_note(tiny, capsys):
    """Mutant: "(each sample fetches its own rows)" shown for one sample too."""
    path, tok, model = tiny
    capsys.readouterr()
    sample.main(["--ckpt", path, "--start", "values of the", "--max_new_tokens", "5", "--temperature", "0", "--offload_tables"])
    err = capsys.readouterr().err
    assert re.search(r"^sample\.py: offload: [\d,]+ table rows fetched, [\d,]+ bytes moved host -> cpu \(on the CPU", err, re.M), err
    assert "each sample" not in err
