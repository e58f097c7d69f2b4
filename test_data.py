"""Tests for prepare_data.py: the whole pipeline on a small local corpus, plus Shakespeare.
Run: python -m pytest -q test_data.py"""

import base64
import errno
import io
import glob
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import prepare_data as pd

HERE = os.path.dirname(os.path.abspath(__file__))
BOS_TEXT_DOC = "a document that mentions <|bos|> and <|endoftext|> as plain text"
WORDS = ("the", "bank", "of", "values", "naïve", "café", "Zürich", "façade", "ĳssel", "Ελλάδα", "Москва",
         "東京", "数据", "한국어", "עברית", "العربية", "🚀", "👩‍💻", "🇫🇷", "x²", "½", "—", "“quoted”",
         "tab\there", "1234567", "3.14159", "e-mail", "don't", "WE'LL", "  ", "\t", "\u00a0", "\r\n")


def make_docs(n=48, seed=0):
    """Deterministic, unique documents with varied Unicode and whitespace."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) for _ in range(rng.randint(4, 30))]
        docs.append(f"doc {i}\n" + "\n".join(lines) + rng.choice(["", "\n", "\n\n", " "]))
    docs[5] = BOS_TEXT_DOC
    return docs


def write_corpus(root):
    """Write make_docs() as a .jsonl file, .txt files and a .parquet file; return (glob, docs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    docs = make_docs()
    os.makedirs(root / "corpus")
    with open(root / "corpus" / "a.jsonl", "w", encoding="utf-8") as f:
        for d in docs[:20]:
            f.write(json.dumps({"text": d, "id": 1}) + "\n")
    for i, d in enumerate(docs[20:30]):
        with open(root / "corpus" / f"b{i}.txt", "w", encoding="utf-8", newline="") as f:
            f.write(d)
    pq.write_table(pa.table({"text": docs[30:]}), root / "corpus" / "c.parquet")
    return str(root / "corpus" / "*"), docs


def prep(*args):
    """Run the CLI in-process; return the exit message (None on success)."""
    try:
        pd.main([str(a) for a in args])
    except SystemExit as e:
        return e.code
    return None


def snapshot(d):
    """{file name: (mtime_ns, sha256)} of everything in dir d."""
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = (os.stat(os.path.join(d, name)).st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
    return out


def split_docs(data_dir, split):
    """Decode the documents of a split: [[token ids of doc], ...] split at bos."""
    meta = pd.load_meta(data_dir)
    docs = []
    for shard in pd.load_tokens(data_dir, split):
        assert shard[0] == meta["bos_id"]  # shards hold whole documents
        starts = np.flatnonzero(shard == meta["bos_id"])
        docs += [shard[a + 1:b] for a, b in zip(starts, list(starts[1:]) + [len(shard)])]
    return docs


FILES_ARGS = ("--vocab_size", 512, "--val_tokens", 3000, "--shard_tokens", 4000)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("c")
    pattern, docs = write_corpus(root)
    out = root / "data"
    assert prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS) is None
    return pattern, docs, str(out)


# -----------------------------------------------------------------------------
# the pipeline on local files

def test_a_million_whitespace_characters_in_a_row_are_encoded(tmp_path):
    """rustbpe and tiktoken overflow their regex stack on a whitespace run of ~1M characters (a Rust panic, not an
    exception: a traceback, at the same document on every rerun). pieces() cuts such runs; the documents, one in each
    split, decode back to themselves, and so does Tokenizer.encode (sample.py, eval.py) of the same text."""
    spaces = ["x" + " " * 1_000_000 + "y", "\u3000\t" * 500_000 + "z\n"]
    os.makedirs(tmp_path / "corpus")
    for i, d in enumerate(spaces + make_docs(8)):
        (tmp_path / "corpus" / f"{i:02d}.txt").write_text(d, encoding="utf-8", newline="")
    assert prep("--source", f"files:{tmp_path / 'corpus' / '*.txt'}", "--out_dir", tmp_path / "d", "--vocab_size", 300,
                "--val_tokens", 10 ** 7) is None
    tok = pd.load_tokenizer(str(tmp_path / "d"))
    decoded = [tok.decode(d) for split in ("val", "train") for d in split_docs(str(tmp_path / "d"), split)]
    assert sorted(decoded) == sorted(spaces + make_docs(8))
    for d in spaces:
        assert tok.decode(tok.encode(d)) == d
    assert [len(p) for p in pd.pieces("a" + " " * 140_000 + "b")] == [65_537, 65_536, 8_929]


def test_a_small_corpus_is_told_that_val_took_half_of_it(tmp_path, capsys):
    """--val_tokens above what every other document holds: val takes half the source, and the note says so."""
    pattern, _ = write_corpus(tmp_path)
    assert prep("--source", "files:" + pattern, "--out_dir", tmp_path / "d", "--vocab_size", 512, "--val_tokens", 10 ** 6) is None
    meta = json.load(open(tmp_path / "d" / "meta.json"))
    assert meta["val_docs"] == 24 and meta["train_docs"] == 24  # 48 documents, every other one to val
    assert (f"note: the source ran out: val has {meta['val_tokens']:,} tokens, not the 1,000,000 asked for (every other "
            f"document, about half the source: a smaller --val_tokens, with --force, leaves more to train on)") in capsys.readouterr().out
    assert prep("--source", "files:" + pattern, "--out_dir", tmp_path / "e", "--vocab_size", 512, "--val_tokens", 3000) is None
    assert "ran out" not in capsys.readouterr().out


@pytest.mark.parametrize("script, typo, flag", [("prepare_data", "--vocab", "--vocab_size"), ("sample", "--num_sample", "--num_samples"),
                                                ("eval", "--max_per_tsk", "--max_per_task"), ("bench", "--round", "--rounds")])
def test_a_mistyped_flag_names_the_nearest(script, typo, flag, capsys):
    """The argparse scripts suggest a flag as train.py does for its settings; an unlike one gets no guess."""
    main = __import__(script).main
    for arg, hint in ((typo, f" (did you mean {flag}?)"), ("--zzz", "")):
        with pytest.raises(SystemExit) as e:
            main([arg] + ["--ckpt", "x"] * (script == "eval"))
        assert e.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"{script}.py: error: unrecognized arguments: {arg}{hint}"


def test_tokenizer_roundtrip_unicode(corpus):
    _, docs, out = corpus
    tok = pd.load_tokenizer(out)
    meta = pd.load_meta(out)
    assert tok.vocab_size == meta["vocab_size"] == 512 and tok.bos_id == 511 == meta["bos_id"]
    samples = docs + ["", "héllo wörld", "日本語のテキスト、中文文本", "emoji 🧪🚀👩‍💻 and flags 🇯🇵",
                      "tabs\tand\nnewlines\r\n\n\n  indented", "\x00 control \x7f chars", "<|bos|>", "ﬁ ligature"]
    for s in samples:
        ids = tok.encode(s)
        assert tok.bos_id not in ids
        assert tok.decode(ids) == s
        assert tok.decode(np.array(ids, dtype=np.uint16)) == s
    # nanochat's split pattern: digits in runs of at most two, so "1234567" (frequent here) is learned in pairs
    digit_tokens = {tok.decode([i]) for i in tok.encode("1234567")}
    assert digit_tokens == {"12", "34", "56", "7"}, digit_tokens


def test_documents_bos_and_disjoint_split(corpus):
    _, docs, out = corpus
    meta = pd.load_meta(out)
    tok = pd.load_tokenizer(out)
    got = {}
    for split in ("train", "val"):
        tokens = pd.load_tokens(out, split)
        assert all(t.dtype == np.uint16 for t in tokens)
        assert sum(len(t) for t in tokens) == meta[split + "_tokens"]
        assert sum(int((t == tok.bos_id).sum()) for t in tokens) == meta[split + "_docs"]
        got[split] = [tok.decode(d) for d in split_docs(out, split)]
    assert len(meta["train_shards"]) > 1  # --shard_tokens 4000 splits the training data
    assert meta["val_tokens"] >= 3000 and meta["val_docs"] < len(docs) / 2
    assert not set(got["train"]) & set(got["val"])
    assert sorted(got["train"] + got["val"]) == sorted(docs)  # every document once, whole
    assert BOS_TEXT_DOC in got["train"] + got["val"]


def spy_on_bpe(monkeypatch):
    """The list that fills with the texts rustbpe's trainer is given (it still trains on them)."""
    import rustbpe
    seen, real = [], rustbpe.Tokenizer

    class Spy:  # records what the tokenizer is trained on
        def __init__(self):
            self.bpe = real()

        def train_from_iterator(self, texts, *a, **k):
            texts = list(texts)
            seen.extend(texts)
            return self.bpe.train_from_iterator(iter(texts), *a, **k)

        def get_mergeable_ranks(self):
            return self.bpe.get_mergeable_ranks()
    monkeypatch.setattr(rustbpe, "Tokenizer", Spy)
    return seen


def test_tokenizer_never_sees_validation_text(tmp_path, monkeypatch):
    pattern, docs = write_corpus(tmp_path)
    seen = spy_on_bpe(monkeypatch)
    out = tmp_path / "s"
    assert prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS) is None
    tok = pd.load_tokenizer(out)
    val = {tok.decode(d) for d in split_docs(out, "val")}
    train = {tok.decode(d) for d in split_docs(out, "train")}
    assert seen and not set(seen) & val and set(seen) <= train


def test_token_bytes_sum_to_corpus_bytes(corpus):
    _, docs, out = corpus
    meta = pd.load_meta(out)
    tb = pd.load_token_bytes(out)
    assert tb.shape == (meta["vocab_size"],) and tb.dtype == np.int32 and tb[meta["bos_id"]] == 0
    assert tb[:256].tolist() == [1] * 256  # the byte tokens
    total = 0
    for split in ("train", "val"):
        for t in pd.load_tokens(out, split):
            total += int(tb[t[t != meta["bos_id"]]].sum())
    assert total == sum(len(d.encode("utf-8")) for d in docs)


def test_a_shard_closes_at_the_first_document_end_at_or_past_shard_tokens(corpus, tmp_path):
    """Documents stay whole: a shard takes documents until it holds --shard_tokens or more. Prepared again with
    --shard_tokens equal to the first shard's size, that shard comes out the same (mutant: `>` for `>=`)."""
    pattern, _, out = corpus
    meta, bos = pd.load_meta(out), pd.load_meta(out)["bos_id"]
    shards = pd.load_tokens(out, "train")
    for s in shards[:-1]:
        last_doc = len(s) - int(np.flatnonzero(np.asarray(s) == bos)[-1])
        assert len(s) - last_doc < 4000 <= len(s)
    first = meta["train_shards"][0]
    assert prep("--source", "files:" + pattern, "--out_dir", tmp_path / "d", "--vocab_size", 512, "--val_tokens", 3000,
                "--shard_tokens", first["tokens"]) is None
    again = pd.load_meta(tmp_path / "d")["train_shards"][0]
    assert {k: again[k] for k in ("tokens", "docs")} == {k: first[k] for k in ("tokens", "docs")}


def test_shard_header_layout(corpus):
    """Other scripts may read shards by the documented layout: 24-byte header, then the ids."""
    _, _, out = corpus
    meta = pd.load_meta(out)
    s = meta["train_shards"][0]
    path = os.path.join(out, s["file"])
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"BOVTOKS\x00"
    assert np.frombuffer(head[8:16], "<u4").tolist() == [1, 2]  # version, bytes per token
    assert int(np.frombuffer(head[16:24], "<u8")[0]) == s["tokens"]
    raw = np.memmap(path, dtype="<u2", mode="r", offset=24)
    assert np.array_equal(raw, pd.load_tokens(out, "train")[0])


def test_rerun_is_idempotent(corpus):
    pattern, _, out = corpus
    before = snapshot(out)
    t0 = time.time()
    assert prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS) is None
    assert time.time() - t0 < 5
    assert snapshot(out) == before


def test_a_reader_allows_a_rerun_that_does_nothing_but_not_one_that_writes(corpus, tmp_path):
    pattern, _, out = corpus
    reader = pd.lock_folder(out, False, "busy")  # what train.py holds on its data
    try:
        before = snapshot(out)
        assert prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS) is None
        assert snapshot(out) == before
        unfinished, damaged = tmp_path / "d", tmp_path / "e"
        shutil.copytree(out, unfinished)
        os.rename(unfinished / "meta.json", unfinished / "progress.json")  # as a run stopped before its end leaves it
        shutil.copytree(out, damaged)
        (damaged / "token_bytes.npy").write_bytes(b"")  # a rerun alone would start over: delete and rebuild
        for folder in (unfinished, damaged):
            before = snapshot(folder)
            with pd.lock_folder(folder, False, "busy"):
                assert prep("--source", "files:" + pattern, "--out_dir", folder, *FILES_ARGS) == \
                    f"prepare_data.py: error: {folder} is in use: another prepare_data.py is writing it, or a train.py is reading it; wait for it to end"
            assert snapshot(folder) == before  # nothing deleted or written under the reader
        assert prep("--source", "files:" + pattern, "--out_dir", unfinished, *FILES_ARGS) is None  # the reader gone: done
        assert (unfinished / "meta.json").exists()
    finally:
        reader.close()


def test_other_arguments_are_refused(corpus):
    pattern, _, out = corpus
    before = snapshot(out)
    msg = prep("--source", "files:" + pattern, "--out_dir", out, "--vocab_size", 600, "--val_tokens", 3000)
    assert "vocab_size" in msg and "--force" in msg and "\n" not in msg
    assert snapshot(out) == before


def test_interrupted_run_resumes(tmp_path, monkeypatch):
    pattern, _ = write_corpus(tmp_path)
    args = ("--source", "files:" + pattern, *FILES_ARGS)
    assert prep(*args, "--out_dir", tmp_path / "clean") is None
    n_shards = len(pd.load_meta(tmp_path / "clean")["train_shards"]) + len(pd.load_meta(tmp_path / "clean")["val_shards"])

    calls = []
    write_shard = pd.write_shard

    def dies_on_third(path, tokens):  # like a kill -9 in the middle of the third shard
        calls.append(path)
        if len(calls) == 3:
            with open(path + ".tmp", "wb") as f:
                f.write(b"half a shard")
            raise KeyboardInterrupt
        write_shard(path, tokens)
    monkeypatch.setattr(pd, "write_shard", dies_on_third)
    out = tmp_path / "resumed"
    assert prep(*args, "--out_dir", out) == 130  # "interrupted; re-run the same command to resume"
    with pytest.raises(pd.DataError, match="incomplete"):
        pd.load_meta(out)

    calls.clear()
    monkeypatch.setattr(pd, "write_shard", lambda path, tokens: (calls.append(path), write_shard(path, tokens)))
    assert prep(*args, "--out_dir", out) is None
    assert len(calls) == n_shards - 2  # the two finished shards were kept
    clean, resumed = snapshot(tmp_path / "clean"), snapshot(out)
    assert {k: v[1] for k, v in clean.items()} == {k: v[1] for k, v in resumed.items()}  # same names, same bytes


def test_a_file_reached_through_symlinks_is_read_once(tmp_path, monkeypatch):
    """Without links, files: matches what glob.glob does (hidden names, nested and leading **, escaped folders);
    with two links back into the corpus (2^40 paths to glob) and a link to a file, each file is read once
    (read again, its documents could land in both splits)."""
    c = tmp_path / "c"
    for name in ("a.txt", "b.md", ".h.txt", "s/c.txt", "s/t/d.txt", "s/.hid/e.txt", "s/t/u/f.jsonl", "x[1]/g.txt"):
        (c / name).parent.mkdir(parents=True, exist_ok=True)
        (c / name).write_text(name)
    monkeypatch.chdir(c)
    for pattern in ("**/*.txt", "**", "*/**/*.txt", "s/**/t/*", "**/t/**/*", "x[[]1]/**/*.txt", "**/.h*", "s/**//*", "**/",
                    "./**/*.txt"):
        for p in (pattern, f"{c}/{pattern}"):
            assert pd.match_files(p) == sorted(f for f in glob.glob(p, recursive=True) if os.path.isfile(f)), p
    os.symlink(c, c / "s" / "loop")
    os.symlink(c, c / "loop2")
    os.symlink(c / "a.txt", c / "z.txt")
    os.symlink("self", c / "self")  # a link to itself beside real folders: is_dir() raises for it alone
    assert pd.Source(f"files:{c}/**/*.txt", "text", "train").paths == [
        f"{c}/{name}" for name in ("a.txt", "s/c.txt", "s/t/d.txt", "x[1]/g.txt")]


def test_a_resume_refuses_files_that_changed(tmp_path, monkeypatch, capsys):
    """Rows are numbered across the matched files and the val split is chosen by row: a resume after a file
    was added would put val documents into train. It is refused in one line, the folder untouched; with
    the files as they were, the resume goes ahead."""
    pattern, docs = write_corpus(tmp_path)
    args = ("--source", "files:" + pattern, *FILES_ARGS, "--out_dir", tmp_path / "out")
    write_shard = pd.write_shard
    def dies(path, tokens):
        raise KeyboardInterrupt
    monkeypatch.setattr(pd, "write_shard", dies)
    assert prep(*args) == 130
    monkeypatch.setattr(pd, "write_shard", write_shard)
    added = tmp_path / "corpus" / "a0.jsonl"  # sorts first: every later row number moves
    added.write_text(json.dumps({"text": docs[0]}) + "\n")
    before = snapshot(tmp_path / "out")
    msg = prep(*args)
    assert "changed" in msg and "--force" in msg and "\n" not in msg
    assert snapshot(tmp_path / "out") == before
    added.unlink()
    assert prep(*args) is None and pd.load_meta(tmp_path / "out")["train_shards"]
    capsys.readouterr()
    added.write_text(json.dumps({"text": docs[0]}) + "\n")  # once finished, a change is noted, the data kept
    before = snapshot(tmp_path / "out")
    assert prep(*args) is None and snapshot(tmp_path / "out") == before
    assert capsys.readouterr().out.splitlines()[-1] == (f"note: the files of files:{pattern} changed since {tmp_path / 'out'} "
                                                        f"was prepared; it holds them as they were (--force prepares them again)")
    added.unlink()
    assert prep(*args) is None and "note" not in capsys.readouterr().out


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:notaport", "huggingface.co"])
def test_a_malformed_hf_endpoint_is_one_line(tmp_path, monkeypatch, endpoint):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    msg = prep("--source", "climbmix", "--out_dir", tmp_path / "x")
    assert msg == f"prepare_data.py: error: HF_ENDPOINT={endpoint!r} is not an http(s) URL"
    assert not (tmp_path / "x").exists()


def test_many_tiny_shards_rewrite_progress_a_bounded_number_of_times(tmp_path, monkeypatch):
    """One shard per document: progress.json (which lists every shard) is rewritten after each of the
    first 100 shards, then each time the list grows by 1%, not after all 1,200 (quadratic bytes)."""
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(1200):
            f.write(json.dumps({"text": f"document {i} says {i % 7} things."}) + "\n")
    sizes, write_json = [], pd.write_json

    def counting(path, obj):  # the shards each progress.json write lists
        if path.endswith("progress.json"):
            sizes.append(len(obj["train_shards"]) + len(obj["val_shards"]))
        write_json(path, obj)
    monkeypatch.setattr(pd, "write_json", counting)
    assert prep("--source", f"files:{tmp_path / 'docs.jsonl'}", "--out_dir", tmp_path / "out", "--vocab_size", 300,
                "--val_tokens", 10, "--shard_tokens", 1) is None
    meta = pd.load_meta(tmp_path / "out")
    n = len(meta["train_shards"]) + len(meta["val_shards"])
    assert n == 1200 and meta["train_docs"] + meta["val_docs"] == 1200
    assert len(sizes) < 500 and sum(sizes) < 250_000  # every shard: 1,200 writes listing 720,000 shards in all
    assert all(b - a <= max(1, b // 100) for a, b in zip(sizes, sizes[1:]))  # a resume redoes at most 1%


def test_damaged_shard_is_detected_and_rebuilt(tmp_path):
    pattern, _ = write_corpus(tmp_path)
    args = ("--source", "files:" + pattern, "--out_dir", tmp_path / "d", *FILES_ARGS)
    assert prep(*args) is None
    out = str(tmp_path / "d")
    good = snapshot(out)
    shard = os.path.join(out, pd.load_meta(out)["train_shards"][1]["file"])
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 10)
    with pytest.raises(pd.DataError) as e:
        pd.load_tokens(out, "train")
    msg = str(e.value)
    assert shard in msg and "truncated" in msg and "prepare_data.py" in msg and "\n" not in msg
    pd.load_tokens(out, "val")  # the other split still loads

    with open(shard, "r+b") as f:
        f.write(b"NOTASHRD")
    with pytest.raises(pd.DataError, match="corrupt"):
        pd.load_tokens(out, "train")

    assert prep(*args) is None  # rebuilds the damaged shard (and those after it)
    assert {k: v[1] for k, v in snapshot(out).items()} == {k: v[1] for k, v in good.items()}


def test_hf_source_reads_like_files(tmp_path, monkeypatch):
    """hf:NAME goes through datasets' streaming loader; a local dataset dir needs no network."""
    pattern, _ = write_corpus(tmp_path)
    for name in os.listdir(tmp_path / "corpus"):
        if not name.endswith(".jsonl"):
            os.remove(tmp_path / "corpus" / name)
    monkeypatch.setattr(pd, "_check_hub", lambda: None)
    args = ("--vocab_size", 300, "--val_tokens", 2000)
    assert prep("--source", "hf:" + str(tmp_path / "corpus"), "--out_dir", tmp_path / "hf", *args) is None
    assert prep("--source", "files:" + pattern, "--out_dir", tmp_path / "files", *args) is None
    for split in ("train", "val"):
        hf, files = pd.load_tokens(tmp_path / "hf", split), pd.load_tokens(tmp_path / "files", split)
        assert np.array_equal(np.concatenate(hf), np.concatenate(files))
    assert pd.load_meta(tmp_path / "hf")["train_docs"] + pd.load_meta(tmp_path / "hf")["val_docs"] == 20


def test_gpt2_tokenizer_plumbing_and_uint32(tmp_path, monkeypatch):
    """--tokenizer gpt2 stores tiktoken's ranks with bos <|endoftext|>. The ranks are faked (no
    network): all 1- and 2-byte tokens, a vocab over 65536, so the shards must be uint32."""
    import tiktoken_ext.openai_public as openai_public
    pattern, docs = write_corpus(tmp_path)
    ranks = [bytes([i]) for i in range(256)] + [bytes([a, b]) for a in range(256) for b in range(256)]
    fake = {"name": "gpt2", "pat_str": openai_public.r50k_pat_str, "special_tokens": {"<|endoftext|>": len(ranks)},
            "mergeable_ranks": {b: i for i, b in enumerate(ranks)}}
    monkeypatch.setattr(openai_public, "gpt2", lambda: fake)
    monkeypatch.setattr(pd, "_gpt2_cached", lambda: True)
    out = tmp_path / "g"
    assert prep("--source", "files:" + pattern, "--tokenizer", "gpt2", "--val_tokens", 3000, "--out_dir", out) is None
    meta, tok = pd.load_meta(out), pd.load_tokenizer(out)
    assert meta["tokenizer"] == "gpt2" and meta["bos_token"] == "<|endoftext|>"
    assert tok.bos_id == meta["bos_id"] == 65792 and tok.vocab_size == meta["vocab_size"] == 65793
    assert meta["dtype"] == "uint32"
    tokens = pd.load_tokens(out, "train") + pd.load_tokens(out, "val")
    assert all(t.dtype == np.uint32 for t in tokens) and max(int(t.max()) for t in tokens) == 65792
    tb = pd.load_token_bytes(out)
    assert sum(int(tb[t].sum()) for t in tokens) == sum(len(d.encode()) for d in docs)
    assert tok.decode(tok.encode(docs[0])) == docs[0]


# -----------------------------------------------------------------------------
# failures: one clear line, fast, nothing written

def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("source,offline", [("climbmix", "dead endpoint"), ("hf:roneneldan/TinyStories", "HF_HUB_OFFLINE")])
def test_hub_offline_cli(tmp_path, source, offline):
    """The real CLI, as a user runs it: one line on stderr, no traceback, no output dir."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
           and not k.lower().endswith("_proxy")}  # a proxy would answer for the dead endpoint
    if offline == "dead endpoint":
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{closed_port()}"
    else:
        env["HF_HUB_OFFLINE"] = "1"
    out = tmp_path / "x"
    t0 = time.time()
    r = subprocess.run([sys.executable, os.path.join(HERE, "prepare_data.py"), f"--source={source}", "--out_dir", str(out)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 10
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "hub" in r.stderr and "shakespeare" in r.stderr.lower() and "files:" in r.stderr
    assert not out.exists()


def test_hub_check_times_out_fast(tmp_path, monkeypatch):
    """A hub that never answers (or a DNS lookup that hangs) still fails within seconds."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    def hang(*args, **kwargs):
        time.sleep(60)
        raise OSError("timed out")
    monkeypatch.setattr(socket, "create_connection", hang)
    t0 = time.time()
    msg = prep("--source", "climbmix", "--out_dir", tmp_path / "x")
    assert time.time() - t0 < 10
    assert "unreachable" in msg and "\n" not in msg
    assert not (tmp_path / "x").exists()


def test_the_hub_and_gpt2_checks_go_through_a_proxy(monkeypatch):
    """Behind $https_proxy the hub client and tiktoken connect to the proxy, not the hub: the
    reachability checks must ask the proxy (else a proxied network is refused as offline), honour
    $no_proxy, and name the proxy when it is the one that is down."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "http_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.invalid")  # resolves nowhere: only the proxy can answer
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        port = proxy.getsockname()[1]
        monkeypatch.setenv("https_proxy", f"127.0.0.1:{port}")
        pd._check_hub()  # reachable through the proxy: no error
        assert pd.connect_target("https://openaipublic.blob.core.windows.net/") == ("127.0.0.1", port)
        monkeypatch.setenv("no_proxy", "hub.example.invalid")
        with pytest.raises(pd.DataError, match=r"^the Hugging Face hub \(hub.example.invalid:443\) is unreachable; "):
            pd._check_hub()  # bypassed: the host itself is asked, and it does not resolve
        monkeypatch.delenv("no_proxy")
    with pytest.raises(pd.DataError, match=rf"^the Hugging Face hub \(hub.example.invalid:443 via proxy 127.0.0.1:{port}\) is unreachable; "):
        pd._check_hub()  # the proxy is down
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:notaport")
    with pytest.raises(pd.DataError, match=r"^the https proxy 'http://127.0.0.1:notaport' set in the environment is not a host:port URL$"):
        pd._check_hub()


def test_the_gpt2_check_asks_the_proxy_too(tmp_path, monkeypatch):
    """tiktoken downloads the gpt2 files through $https_proxy: without them in its cache, the check asks the proxy."""
    for var in ("http_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("https_proxy", "127.0.0.1:9")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    asked = []
    monkeypatch.setattr(pd, "reachable", lambda host, port, timeout: asked.append((host, port)) or False)
    with pytest.raises(pd.DataError, match=r"^the gpt2 tokenizer is not in tiktoken's cache and "
                                           r"openaipublic.blob.core.windows.net:443 via proxy 127.0.0.1:9 is unreachable; "):
        pd.gpt2_tokenizer_json()
    assert asked == [("127.0.0.1", 9)]


def test_gpt2_tokenizer_offline(tmp_path, monkeypatch):
    pattern, _ = write_corpus(tmp_path)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))

    def offline(*a, **k):
        raise OSError("network is unreachable")
    monkeypatch.setattr(socket, "create_connection", offline)
    t0 = time.time()
    msg = prep("--source", "files:" + pattern, "--tokenizer", "gpt2", "--out_dir", tmp_path / "g")
    assert time.time() - t0 < 10
    assert "gpt2" in msg and "cache" in msg and "unreachable" in msg and "\n" not in msg
    assert not (tmp_path / "g").exists()


def test_an_empty_out_dir_is_refused_not_read_as_the_default(capsys):
    assert prep("--out_dir", "") == 2 and capsys.readouterr().err.splitlines()[-1].endswith(
        ": error: --out_dir is empty; leave it out for the default folder, or name one")


def test_bad_input_is_one_line(tmp_path, monkeypatch):
    assert "unknown --source" in prep("--source", "nope", "--out_dir", tmp_path / "a")
    for spec in ("hf", "files", "shakespeare:x", "climbmix:en"):  # were read as files: globs ('', 'peare:x', 'ix:en')
        assert prep("--source", spec, "--out_dir", tmp_path / "a") == (
            f"prepare_data.py: error: unknown --source {spec!r}; use shakespeare, climbmix, hf:NAME[:CONFIG] or files:GLOB")
    assert "no files match" in prep("--source", "files:" + str(tmp_path / "none*.jsonl"), "--out_dir", tmp_path / "a")
    odd = tmp_path / "it's d[1]"  # a folder: the glob to give, escaped for glob and quoted for a shell
    (odd / "x.jsonl").mkdir(parents=True)  # a folder, not a file of that type
    (odd / ".hidden.txt").write_text("hello")  # skipped by glob, so not offered
    (odd / "sub").mkdir()
    (odd / "sub" / "rows.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")  # below it: the general hint
    hint = prep("--source", f"files:{odd}", "--out_dir", tmp_path / "a")
    assert hint.startswith(f"prepare_data.py: error: {str(odd)!r} is a folder with no .jsonl, .parquet, .txt or .md "
                           f"files of its own; give a glob of the files below it, e.g. --source=")
    assert shlex.split(hint.split("--source=")[1]) == [f"files:{tmp_path}/it's d[[]1]/**/*.txt"]
    def denied(path):  # (the tests run as root, who may list any folder)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    with monkeypatch.context() as m:
        m.setattr(pd.os, "scandir", denied)
        assert prep("--source", f"files:{odd}", "--out_dir", tmp_path / "a") == (
            f"prepare_data.py: error: {str(odd)!r} is a folder that cannot be listed (Permission denied)")
    (odd / "top.md").write_text("hello")
    (odd / "top.txt").write_text("hello")  # its own files: the first type of .jsonl, .parquet, .txt, .md
    hint = prep("--source", f"files:{odd}", "--out_dir", tmp_path / "a").split("--source=")[1]
    assert shlex.split(hint) == [f"files:{tmp_path}/it's d[[]1]/*.txt"]
    assert glob.glob(shlex.split(hint)[0][len("files:"):]) == [str(odd / "top.txt")]
    assert "does not apply" in prep("--val_tokens", 1000, "--out_dir", tmp_path / "a")
    with pytest.raises(pd.DataError, match=f"^no prepared data in {tmp_path / 'a'}; run `python prepare_data.py --source=... "
                                           f"--out_dir={tmp_path / 'a'}` first$"):
        pd.load_meta(tmp_path / "a")
    above = tmp_path / "above"  # the folder above prepared ones (--data_dir=data): they are named
    for name in ("shakespeare", "x"):
        os.makedirs(above / name)
        (above / name / "meta.json").write_text("{}")
    with pytest.raises(pd.DataError, match=f"^no prepared data in {above} itself, but in the folders below it: "
                                           f"{above / 'shakespeare'}, {above / 'x'}; give one of those$"):
        pd.load_meta(above)
    assert pd.prepare_command("data/climbmix") == "python prepare_data.py --source=climbmix"  # what config/paper_135m.py reads
    assert pd.prepare_command("./data/shakespeare") == "python prepare_data.py"
    assert pd.prepare_command("data/files") == "python prepare_data.py --source=files:GLOB"  # --source=files alone is refused
    assert "unknown --source" in prep("--source", "nope", "--data_dir", tmp_path / "a")  # train.py's name for the folder
    assert "at most 2^32" in prep("--vocab_size", "1e12", "--out_dir", tmp_path / "a")
    assert not (tmp_path / "a").exists()
    (tmp_path / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    (tmp_path / "fake.parquet").write_text("not parquet")
    (tmp_path / "file").write_text("")
    files = lambda name: "files:" + str(tmp_path / name)
    os.symlink(tmp_path / "unmounted", tmp_path / "dangling")  # out/ linked to a scratch disk that is not there
    os.symlink("loop", tmp_path / "loop")
    for args, expected in (((files("latin1.txt"), tmp_path / "dangling"), f"--out_dir {tmp_path / 'dangling'} is a link to "
                            f"{tmp_path / 'unmounted'} that cannot be followed: No such file or directory"),
                           ((files("latin1.txt"), tmp_path / "loop"), f"--out_dir {tmp_path / 'loop'} is a link to loop that "
                            "cannot be followed: Too many levels of symbolic links"),
                           ((files("latin1.txt"), tmp_path / "b"), f"{tmp_path / 'latin1.txt'} is not UTF-8 text (byte 0xe9"),
                           ((files("fake.parquet"), tmp_path / "b"), f"{tmp_path / 'fake.parquet'} is not a readable parquet file"),
                           ((files("latin1.txt"), tmp_path / "file"), f"--out_dir {tmp_path / 'file'} is a file, not a folder"),
                           ((files("latin1.txt"), tmp_path / "file" / "sub"), f"cannot write {tmp_path / 'file' / 'sub'}: Not a directory")):
        msg = prep("--source", args[0], "--vocab_size", 300, "--out_dir", args[1])
        assert msg.startswith("prepare_data.py: error: ") and expected in msg and "\n" not in msg, msg
    # train.py's --out_dir and bench.py's --plot_dir say the same
    assert pd.out_dir_problem(tmp_path / "loop") == "is a link to loop that cannot be followed: Too many levels of symbolic links"


def test_a_closed_or_full_stdout_is_one_line(tmp_path):
    pattern, _ = write_corpus(tmp_path)
    cmd = [sys.executable, "prepare_data.py", "--source", "files:" + pattern, "--vocab_size", "300", "--val_tokens", "500",
           "--out_dir", str(tmp_path / "data")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as in a user's shell
    assert subprocess.run(cmd, cwd=HERE, capture_output=True, env=env).returncode == 0
    (tmp_path / "data" / "progress.json").write_text("{}")  # as a kill between meta.json and its removal leaves it
    p = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    p.stdout.close()  # `| head` that has left: "already prepared" meets a closed pipe
    assert p.wait(timeout=60) == 1 and p.stderr.read() == ("prepare_data.py: stopped: the reader of stdout left; re-run "
                                                           "the same command to resume (or to see that it is done)\n")
    assert not (tmp_path / "data" / "progress.json").exists()  # a finished folder's rerun clears the leftover
    with open("/dev/full", "w") as full:
        r = subprocess.run(cmd, cwd=HERE, stdout=full, stderr=subprocess.PIPE, text=True, env=env)
    assert r.returncode == 1 and r.stderr == "prepare_data.py: error: cannot write the output: No space left on device\n"
    r = subprocess.run(cmd, cwd=HERE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=lambda: os.close(1))  # `>&-`
    assert r.returncode == 0 and r.stderr == ""


def test_prepared_data_without_read_access_is_not_called_damaged(tmp_path, monkeypatch):
    """A file or folder this user may not read was 'unreadable; re-run prepare_data.py with --force' (rebuilding data
    that is intact) or 'no prepared data'; root, who runs the tests here, reads anything: the denial is simulated."""
    pattern, _ = write_corpus(tmp_path)
    data = tmp_path / "data"
    assert prep("--source", "files:" + pattern, "--vocab_size", 300, "--val_tokens", 500, "--out_dir", data) is None
    real_open = open
    def denied(file, *a, **k):
        if os.fspath(file).endswith(("meta.json", "tokenizer.json")):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_open(file, *a, **k)
    monkeypatch.setattr("builtins.open", denied)
    with pytest.raises(pd.DataError, match=rf"^cannot read {data / 'meta.json'}: permission denied \(the data may be intact"):
        pd.load_meta(str(data))
    monkeypatch.undo()
    shard = os.path.join(data, pd.load_meta(str(data))["val_shards"][0]["file"])
    def shard_denied(file, *a, **k):
        if os.fspath(file) == shard:
            raise PermissionError(errno.EACCES, "Permission denied", shard)
        return real_open(file, *a, **k)
    monkeypatch.setattr("builtins.open", shard_denied)
    with pytest.raises(pd.DataError, match=rf"^cannot read {shard}: permission denied \(the data may be intact"):
        pd.load_tokens(str(data), "val")
    monkeypatch.undo()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and os.fspath(p) != str(data))
    monkeypatch.setattr(os.path, "exists", lambda p: not os.fspath(p).startswith(str(data) + os.sep))  # as x denied
    with pytest.raises(pd.DataError, match=rf"^cannot read the folder {data}: permission denied$"):
        pd.load_meta(str(data))


def test_help_to_a_full_disk_is_one_line_and_to_a_reader_that_left_quiet(capsys):
    """The scripts' parser (sample, bench, eval, prepare_data): argparse's own write dropped the OSError of a full disk
    and exited 0 with the help lost; a closed pipe (`--help | head`) stays a quiet exit 0."""
    parser = pd.ArgumentParser(prog="x.py")
    class Failing(io.StringIO):  # a stdout whose flush fails as a full disk's, or a closed pipe's, does
        def __init__(self, error):
            super().__init__()
            self.error = error
        def flush(self):
            raise self.error
    with pytest.raises(SystemExit) as e:
        parser.print_help(Failing(OSError(errno.ENOSPC, "No space left on device")))
    assert e.value.code == 1 and capsys.readouterr().err == "x.py: error: cannot write the help to stdout: No space left on device\n"
    with pytest.raises(SystemExit) as e:
        parser.print_help(Failing(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert e.value.code == 0 and capsys.readouterr().err == ""
    parser.print_help()
    assert capsys.readouterr().out.startswith("usage: x.py [-h]")


def test_force_deletes_nothing_when_the_new_source_is_bad(tmp_path):
    """--force with a mistyped source, or a tokenizer that cannot be trained, leaves the prepared data as it was."""
    pattern, _ = write_corpus(tmp_path)
    out = tmp_path / "data"
    assert prep("--source", "files:" + pattern, "--vocab_size", 300, "--val_tokens", 500, "--out_dir", out) is None
    before = snapshot(out)
    assert "no files match" in prep("--source", "files:" + str(tmp_path / "typo*.txt"), "--force", "--out_dir", out)
    assert snapshot(out) == before
    # ... nor when its tokenizer cannot be made: a vocabulary the text cannot fill
    assert "only supports" in prep("--source", "files:" + pattern, "--vocab_size", 200000, "--val_tokens", 500, "--force",
                                   "--out_dir", out)
    assert snapshot(out) == before
    # a new folder (parents included) that a failed run made goes again: no folder holding only a lock file
    assert "only supports" in prep("--source", "files:" + pattern, "--vocab_size", 200000, "--val_tokens", 500,
                                   "--out_dir", tmp_path / "new" / "data")
    assert not (tmp_path / "new").exists()
    # an --out_dir that is a file is refused before a tokenizer is trained for it
    (tmp_path / "a_file").write_text("")
    assert prep("--source", "files:" + pattern, "--vocab_size", 200000, "--force", "--out_dir", tmp_path / "a_file") == \
        f"prepare_data.py: error: --out_dir {tmp_path / 'a_file'} is a file, not a folder"
    # a folder that cannot be written (a read-only mount; root may write anywhere else, so os.access stands in): refused
    # before the tokenizer trains, when there is work; a finished folder is still read
    real_access = pd.os.access
    pd.os.access = lambda path, mode: mode != os.W_OK and real_access(path, mode)
    trained = []
    real_train, pd.train_bpe_json = pd.train_bpe_json, lambda *a: trained.append(1)
    try:
        (tmp_path / "empty").mkdir()
        for folder, args in ((out, ["--force"]), (tmp_path / "empty", [])):  # --force; a folder to prepare
            assert prep("--source", "files:" + pattern, "--vocab_size", 300, "--val_tokens", 500, "--out_dir", folder, *args) \
                == f"prepare_data.py: error: --out_dir {folder} is not writable"
        assert trained == [] and snapshot(out) == before
        assert prep("--source", "files:" + pattern, "--vocab_size", 300, "--val_tokens", 500, "--out_dir", out) is None
    finally:
        pd.os.access, pd.train_bpe_json = real_access, real_train
    # a state whose shard list is damaged: a rerun says so in one line
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps(dict(meta, train_shards=[5])))
    assert prep("--source", "files:" + pattern, "--vocab_size", 300, "--val_tokens", 500, "--out_dir", out) == (
        f"prepare_data.py: error: {out / 'meta.json'} lists a train shard without a file name, token and document counts and end row; "
        f"pass --force to rebuild {out}")
    (out / "meta.json").write_text(json.dumps(meta))
    (out / "meta.json").write_text("[1]")  # valid JSON, not a state file
    assert "is not a prepare_data.py state file; pass --force" in prep("--source", "files:" + pattern, "--vocab_size", 300,
                                                                      "--val_tokens", 500, "--out_dir", out)


def test_ctrl_c_while_the_tokenizer_trains_stops_the_run(tmp_path, monkeypatch, capsys):
    """rustbpe swallows a KeyboardInterrupt raised while it trains and returns as if done; the
    Ctrl-C must still stop the run (a fake trainer that does what rustbpe does)."""
    import rustbpe

    class Swallowing:
        def train_from_iterator(self, texts, vocab_size, pattern):
            for _ in texts:
                pass
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the signal handler runs here
            except KeyboardInterrupt:
                pass  # what rustbpe does with it

        def get_mergeable_ranks(self):
            return [(bytes([i]), i) for i in range(256)]
    monkeypatch.setattr(rustbpe, "Tokenizer", Swallowing)
    pattern, _ = write_corpus(tmp_path)
    code = prep("--source", "files:" + pattern, "--vocab_size", 257, "--val_tokens", 500, "--out_dir", tmp_path / "d")
    assert code == 130  # 128 + SIGINT, as the other scripts exit after a Ctrl-C
    assert capsys.readouterr().err.splitlines()[-1] == "prepare_data.py: interrupted; re-run the same command to resume"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the usual Ctrl-C again afterwards


def test_more_bad_input_is_one_line(tmp_path, monkeypatch, capsys):
    pattern, _ = write_corpus(tmp_path)
    args = ("--vocab_size", 300, "--val_tokens", 500)
    # --force with a gpt2 tokenizer that cannot be had deletes nothing
    out = tmp_path / "data"
    assert prep("--source", "files:" + pattern, *args, "--out_dir", out) is None
    (out / "notes.tmp").write_text("the user's own file")
    before = snapshot(out)
    def unavailable():
        raise pd.DataError("the gpt2 tokenizer is not in tiktoken's cache")
    monkeypatch.setattr(pd, "gpt2_tokenizer_json", unavailable)
    assert "gpt2 tokenizer is not in" in prep("--source", "files:" + pattern, "--tokenizer", "gpt2", "--val_tokens", 500,
                                               "--force", "--out_dir", out)
    assert snapshot(out) == before
    # a rerun leaves files that are not its own temporaries alone; an empty token_bytes.npy is rebuilt
    (out / "token_bytes.npy").write_bytes(b"")
    with pytest.raises(pd.DataError, match="token_bytes.npy is unreadable"):
        pd.load_token_bytes(out)
    kept = snapshot(out)  # a start-over deletes nothing before the new source is found (its files moved away)
    os.rename(tmp_path / "corpus", tmp_path / "away")
    assert prep("--source", "files:" + pattern, *args, "--out_dir", out).endswith(f"no files match {pattern!r}")
    assert snapshot(out) == kept
    os.rename(tmp_path / "away", tmp_path / "corpus")
    assert prep("--source", "files:" + pattern, *args, "--out_dir", out) is None
    assert "starting over" in capsys.readouterr().out
    assert (out / "notes.tmp").read_text() == "the user's own file" and len(pd.load_token_bytes(out)) == 300
    assert prep("--source", "files:" + pattern, *args, "--force", "--out_dir", out) is None  # as --help says: ours only
    assert (out / "notes.tmp").read_text() == "the user's own file"
    # a state file from elsewhere: an unknown key, a list
    meta = json.loads((out / "meta.json").read_text())
    meta["config"]["extra"] = 1
    (out / "meta.json").write_text(json.dumps(meta))
    msg = prep("--source", "files:" + pattern, *args, "--out_dir", out)
    assert "other arguments (extra: 1, now no such argument)" in msg and "\n" not in msg
    (out / "meta.json").write_text("[]")
    with pytest.raises(pd.DataError, match="is not a prepare_data.py meta file"):
        pd.load_meta(out)
    for key, value, expected in (("vocab_size", None, "has no vocab_size"), ("train_shards", [], "has no train_shards"),
                                 ("dtype", "float99", "has dtype 'float99'"),
                                 ("train_shards", [5], "lists a train shard without a file name, token and document counts and end row"),
                                 ("val_shards", [{"file": "val_00000.bin"}], "lists a val shard without a file name")):
        edited = dict(meta, **{key: value})
        (out / "meta.json").write_text(json.dumps(edited))
        with pytest.raises(pd.DataError, match=expected):
            pd.load_tokens(out, "train")
    # a tokenizer file that is JSON but not a tokenizer: one line from the scripts that read it
    (out / "meta.json").write_text(json.dumps(meta))
    good_tok = (out / "tokenizer.json").read_text()
    for text in ("{}", "[]", json.dumps({k: v for k, v in json.loads(good_tok).items() if k != "pattern"})):
        (out / "tokenizer.json").write_text(text)
        with pytest.raises(pd.DataError, match=r"tokenizer.json is not a prepare_data.py tokenizer \((KeyError|TypeError)"):
            pd.load_tokenizer(out)
    (out / "tokenizer.json").write_text(good_tok)
    # counts that are not finite
    for flag in ("--vocab_size", "--train_tokens"):
        with pytest.raises(SystemExit) as e:
            pd.main(["--source", "files:" + pattern, flag, "inf", "--out_dir", str(tmp_path / "x")])
        assert e.value.code == 2 and "must be a positive whole number: 'inf'" in capsys.readouterr().err
    # a lone surrogate (valid JSON, not text), a bad byte far into a file, a source with no training text
    (tmp_path / "s.jsonl").write_text('{"text": "fine"}\n{"text": "half an emoji \\ud83d here"}\n')
    (tmp_path / "late.txt").write_bytes(b"a" * 100_000 + b"\xff" + b"b" * 10)
    (tmp_path / "one.txt").write_text("a single document")
    (tmp_path / "int.jsonl").write_text('{"text": "fine"}\n{"text": null}\n{"text": 7}\n')
    (tmp_path / "cut.jsonl").write_text('{"text": "fine"}\n\n{"text": "cut sh\n')
    (tmp_path / "odd.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in [d if i % 2 else None for i, d in enumerate(make_docs(12))]))
    files = lambda name: "files:" + str(tmp_path / name)
    for source, expected in ((files("s.jsonl"), f"{tmp_path / 's.jsonl'}:2: the 'text' text holds a lone UTF-16 surrogate"),
                             (files("int.jsonl"), f"{tmp_path / 'int.jsonl'}:3: the 'text' field holds int, not text"),
                             (files("cut.jsonl"), f"{tmp_path / 'cut.jsonl'}:3: not JSON ("),
                             (files("late.txt"), "is not UTF-8 text (byte 0xff at offset 100000)"),
                             (files("one.txt"), "gave no training text for the tokenizer: val takes every other "
                              "document from the start until it has --val_tokens, train the rest, so it needs at least "
                              "two documents (a .txt or .md file is one document, a .jsonl or .parquet file one per row)"),
                             (files("odd.jsonl"), "gave no val documents: val takes every other document from the start "
                              "until it has --val_tokens, train the rest, so it needs at least two documents (a .txt or "
                              ".md file is one document, a .jsonl or .parquet file one per row) (or a smaller "
                              "--val_tokens, with --force)")):
        msg = prep("--source", source, *args, "--out_dir", tmp_path / "y")
        assert msg.startswith("prepare_data.py: error: ") and expected in msg and "\n" not in msg, msg
    capsys.readouterr()
    prep("--source", files("one.txt"), *args, "--out_dir", tmp_path / "z")
    assert "tokenizer text" not in capsys.readouterr().err  # no empty progress bar before the one-line refusal


def test_a_hub_stream_that_fails_midway_is_one_line(tmp_path, monkeypatch):
    """A dropped connection: the rerun resumes. A malformed row (pyarrow's ArrowInvalid, a ValueError): every rerun
    stops there, so it is not told to rerun."""
    import datasets
    import pyarrow as pa

    class Stream:
        column_names = ["text"]

        def __init__(self, error):
            self.error = error

        def select_columns(self, columns):
            yield {"text": "the first document " * 20}
            yield {"text": "the second document " * 20}
            raise self.error
    monkeypatch.setattr(pd, "_check_hub", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: Stream(ConnectionError("Connection reset by peer\nmore")))
    msg = prep("--source", "hf:someone/data", "--vocab_size", 257, "--out_dir", tmp_path / "h")
    assert msg == ("prepare_data.py: error: reading someone/data from the hub failed after 2 rows: ConnectionError: "
                   "Connection reset by peer; re-run the same command to resume")
    bad = pa.ArrowInvalid("JSON parse error: Invalid encoding in string. in row 149")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: Stream(bad))
    msg = prep("--source", "hf:someone/data", "--vocab_size", 257, "--out_dir", tmp_path / "h")
    assert msg == ("prepare_data.py: error: someone/data has a row that cannot be read, after the first 2 rows of the stream: "
                   "ArrowInvalid: JSON parse error: Invalid encoding in string. in row 149; a rerun would stop there again")

    class BadRequest(OSError, ValueError):  # huggingface_hub's HTTP 400 (BadRequestError) is both: a hub error
        pass
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: Stream(BadRequest("400 Client Error: Bad Request")))
    msg = prep("--source", "hf:someone/data", "--vocab_size", 257, "--out_dir", tmp_path / "h")
    assert msg.endswith("failed after 2 rows: BadRequest: 400 Client Error: Bad Request; re-run the same command to resume")


def test_a_parquet_row_that_is_not_utf8_is_named(tmp_path):
    """The row and column, not an offset into the binary file (its first non-UTF-8 byte is in a page header)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [f"document {i} ".encode() * 50 for i in range(1500)]  # the bad row in the second batch of 1024
    rows[1100] = b"bad \xff\xfe text " * 50
    raw = pa.array(rows, pa.binary())
    os.makedirs(tmp_path / "pq")
    pq.write_table(pa.table({"text": pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())}), tmp_path / "pq" / "a.parquet")
    msg = prep("--source", f"files:{tmp_path / 'pq' / '*.parquet'}", "--vocab_size", 300, "--out_dir", tmp_path / "d")
    assert msg == (f"prepare_data.py: error: {tmp_path / 'pq' / 'a.parquet'}: row 1101: the 'text' value is not UTF-8 "
                   "text (invalid start byte); fix or drop that row")


# -----------------------------------------------------------------------------
# the offline default

def test_shakespeare_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert prep() is None  # `python prepare_data.py`
    out = pd.DEFAULT_DATA_DIR
    meta = pd.load_meta(out)
    assert meta["source"] == "shakespeare" and meta["vocab_size"] == 4096 and meta["bos_id"] == 4095
    plays = dict(pd.shakespeare_plays())
    assert len(plays) == 38 and meta["train_docs"] + meta["val_docs"] == 38
    tok = pd.load_tokenizer(out)
    got = {split: [tok.decode(d) for d in split_docs(out, split)] for split in ("train", "val")}
    assert sorted(got["val"]) == sorted(plays[name] for name in pd.VAL_PLAYS)  # whole plays, exactly
    assert sorted(got["train"]) == sorted(t for name, t in plays.items() if name not in pd.VAL_PLAYS)
    assert got["val"][0].startswith("# ")  # a play starts with its title
    assert not any("  \n" in t or "\\" in t for t in plays.values())  # no Markdown hard breaks or escapes
    assert 1_000_000 < meta["train_tokens"] < 2_000_000


# ---------------------------------------------------------------------------- the shard dtype, blank JSONL lines, --force

@pytest.mark.parametrize("n_ranks, dtype", [(65535, "uint16"), (65536, "uint32")])
def test_uint32_from_a_vocabulary_of_65537(tmp_path, monkeypatch, n_ranks, dtype):
    """Mutant P1 (prepare): uint16 up to a vocabulary of 65537, where bos (id 65536) wraps to 0."""
    import tiktoken_ext.openai_public as openai_public
    (tmp_path / "c").mkdir()
    for i, d in enumerate(make_docs()):
        (tmp_path / "c" / f"{i}.txt").write_text(d, encoding="utf-8")
    ranks = [bytes([i]) for i in range(256)] + [bytes([a, b]) for a in range(256) for b in range(256)]
    ranks = ranks[:n_ranks]
    fake = {"name": "gpt2", "pat_str": openai_public.r50k_pat_str, "special_tokens": {"<|endoftext|>": len(ranks)},
            "mergeable_ranks": {b: i for i, b in enumerate(ranks)}}
    monkeypatch.setattr(openai_public, "gpt2", lambda: fake)
    monkeypatch.setattr(pd, "_gpt2_cached", lambda: True)
    out = tmp_path / "g"
    assert prep("--source", f"files:{tmp_path / 'c' / '*.txt'}", "--tokenizer", "gpt2", "--val_tokens", 3000,
                "--out_dir", out) is None
    meta = pd.load_meta(out)
    assert meta["vocab_size"] == n_ranks + 1 and meta["dtype"] == dtype
    assert all(t[0] == n_ranks for t in pd.load_tokens(out, "train"))  # every shard starts with bos, unwrapped


def test_jsonl_blank_lines_are_skipped(tmp_path):
    """Mutant P4 (_texts_of): blank lines of a .jsonl read as invalid JSON."""
    docs = make_docs()
    with open(tmp_path / "d.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n\n  \n")
    assert prep("--source", f"files:{tmp_path / 'd.jsonl'}", "--vocab_size", 300, "--val_tokens", 500,
                "--out_dir", tmp_path / "out") is None
    meta = pd.load_meta(tmp_path / "out")
    assert meta["train_docs"] + meta["val_docs"] == len(docs)


def test_a_short_write_names_its_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    def full_disk(f):
        f.write(b"half")
        raise OSError("1397523 requested and 897012 written")  # what numpy's tofile raises on a full disk
    shard = str(tmp_path / "train_00000.bin")
    with pytest.raises(OSError) as e:
        pd.atomic_write(shard, full_disk)
    assert e.value.filename == shard and os.listdir(tmp_path) == []
    def no_space(f):  # Python's own write or fsync on a full disk: an errno, no file name
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(OSError) as e:
        pd.atomic_write(shard, no_space)
    assert (e.value.filename, e.value.strerror) == (shard, "No space left on device") and os.listdir(tmp_path) == []
    monkeypatch.setattr(pd, "prepare", lambda *_: pd.atomic_write(shard, full_disk))  # the line prepare_data.py prints
    with pytest.raises(SystemExit) as e:
        pd.main(["--out_dir", str(tmp_path / "d")])
    assert e.value.code == (f"prepare_data.py: error: cannot write {shard}: 1397523 requested and 897012 written "
                            f"(a short write: is the disk full?)")


def test_force_removes_the_old_shards(tmp_path):
    """Mutant P6 (load_state): --force keeps the previous run's shards; those past the new run's count stay behind."""
    (tmp_path / "c").mkdir()
    for i, d in enumerate(make_docs()):
        (tmp_path / "c" / f"{i}.txt").write_text(d, encoding="utf-8")
    args = ("--source", f"files:{tmp_path / 'c' / '*.txt'}", "--vocab_size", 300, "--val_tokens", 500, "--out_dir", tmp_path / "d")
    assert prep(*args, "--shard_tokens", 1000) is None
    assert len(pd.load_meta(tmp_path / "d")["train_shards"]) > 3
    assert prep(*args, "--shard_tokens", 10 ** 6, "--force") is None
    meta = pd.load_meta(tmp_path / "d")
    listed = {s["file"] for s in meta["train_shards"] + meta["val_shards"]}
    assert {f for f in os.listdir(tmp_path / "d") if f.endswith(".bin")} == listed


# from a mutation audit of prepare_data.py (the audit's mutant IDs in the docstrings)

BUDGETS = ("--vocab_size", 512, "--val_tokens", 3000, "--train_tokens", 6000, "--shard_tokens", 1000)


@pytest.mark.parametrize("dies_at", [2, 6])  # in val, in train
def test_a_resumed_preparation_with_budgets_is_the_clean_one(tmp_path, monkeypatch, dies_at):
    """P14 (a resume counts the split's tokens from 0: the budget starts over, so the resumed split holds up to
    twice --val_tokens / --train_tokens, and differs from an uninterrupted preparation)."""
    pattern, _ = write_corpus(tmp_path)
    args = ("--source", "files:" + pattern, *BUDGETS)
    assert prep(*args, "--out_dir", tmp_path / "clean") is None
    calls, write_shard = [], pd.write_shard

    def dies(path, tokens):
        calls.append(path)
        if len(calls) == dies_at:
            raise KeyboardInterrupt
        write_shard(path, tokens)
    monkeypatch.setattr(pd, "write_shard", dies)
    assert prep(*args, "--out_dir", tmp_path / "resumed") == 130
    monkeypatch.setattr(pd, "write_shard", write_shard)
    assert prep(*args, "--out_dir", tmp_path / "resumed") is None
    clean, resumed = snapshot(tmp_path / "clean"), snapshot(tmp_path / "resumed")
    assert {k: v[1] for k, v in clean.items()} == {k: v[1] for k, v in resumed.items()}


def test_a_shard_that_is_not_what_meta_says_is_refused(corpus, tmp_path):
    """P07 (the first-token <|bos|> check dropped), P16 (the header's bytes per token not compared with
    meta's dtype: a uint32 shard of the same count is read as uint16 garbage)."""
    out = tmp_path / "d"
    shutil.copytree(corpus[2], out)
    meta = pd.load_meta(out)
    shard = meta["train_shards"][0]
    path = str(out / shard["file"])
    tokens = np.array(pd.load_tokens(out, "train")[0])
    pd.write_shard(path, tokens.astype(np.uint32))  # a valid shard, of another width
    with pytest.raises(pd.DataError, match="header says .* tokens of 4 bytes, meta says .* of 2"):
        pd.load_tokens(out, "train")
    tokens[0] = 1
    pd.write_shard(path, tokens)  # the right width, but it does not begin a document
    with pytest.raises(pd.DataError, match="does not start with the bos token"):
        pd.load_tokens(out, "train")


def test_bos_decodes_as_its_text(corpus):
    """P12 (decode() drops <|bos|>: its docstring says bos decodes as its text)."""
    tok = pd.load_tokenizer(corpus[2])
    ids = [tok.bos_id] + tok.encode("the bank")
    assert tok.decode(ids) == "<|bos|>the bank"


def test_counts_read_as_english():
    """'1 doc', not '1 docs' (a one-document val split, or sample.py's empty prompt: 'prefill 1 token')."""
    assert [pd.plural(n, "doc") for n in (0, 1, 2, 2048)] == ["0 docs", "1 doc", "2 docs", "2,048 docs"]


# from a second mutation audit of prepare_data.py: behaviours no test checked before

def test_a_damaged_folder_is_refused_in_one_line(corpus, tmp_path):
    """A damaged folder is a DataError naming the file and the way out, never a traceback (FileNotFoundError,
    struct.error, TypeError) nor data read in spite of it: a shard missing, cut inside its header, of another
    format version, whose header and length agree but not with meta.json, or too long; a meta.json of
    another format or with a bad entry after good ones; a tokenizer or token_bytes.npy of another vocabulary."""
    out = tmp_path / "d"
    shutil.copytree(corpus[2], out)
    meta = pd.load_meta(out)
    shard, n = out / meta["train_shards"][0]["file"], meta["train_shards"][0]["tokens"]
    good = shard.read_bytes()

    def refused(call, message):
        with pytest.raises(pd.DataError) as e:
            call()
        assert str(e.value) == message

    shard.unlink()
    refused(lambda: pd.load_tokens(out, "train"),
            f"{shard} is missing; re-run prepare_data.py with the same arguments to rebuild it")
    header = lambda version, count: pd.HEADER.pack(pd.MAGIC, version, 2, count)
    for data, problem in ((good[:10], "is truncated (10 bytes, shorter than its header)"),
                          (header(2, n) + good[24:], "has format version 2, expected 1"),
                          (header(1, n - 5) + good[24:-10],  # a consistent shard of 5 tokens fewer
                           f"is corrupt (header says {n - 5} tokens of 2 bytes, meta says {n} of 2)"),
                          (good + b"\0\0", f"is too long ({len(good) + 2} bytes, expected {len(good)})")):
        shard.write_bytes(data)
        refused(lambda: pd.load_tokens(out, "train"),
                f"{shard} {problem}; re-run prepare_data.py with the same arguments to rebuild it")
    shard.write_bytes(good)
    with pytest.raises(ValueError, match="^split must be 'train' or 'val', not 'test'$"):
        pd.load_tokens(out, "test")

    np.save(out / "token_bytes.npy", np.zeros(10, np.int32))
    refused(lambda: pd.load_token_bytes(out), f"{out / 'token_bytes.npy'} has shape (10,) int32, expected (512,) int32; "
                                              f"re-run prepare_data.py with --force")
    meta_json = out / "meta.json"
    for edit, call, message in (
            (dict(train_shards=meta["train_shards"] + [5]), lambda: pd.load_tokens(out, "train"),
             f"{meta_json} lists a train shard without a file name, token and document counts and end row; re-run prepare_data.py with --force"),
            (dict(format=2), lambda: pd.load_tokens(out, "train"),
             f"{meta_json} has format 2, this code reads 1; re-run prepare_data.py with --force"),
            (dict(vocab_size=513), lambda: pd.load_tokenizer(out),
             f"{out / 'tokenizer.json'} does not match {out}/meta.json; re-run prepare_data.py with --force")):
        meta_json.write_text(json.dumps(dict(meta, **edit)))
        refused(call, message)
    meta_json.write_text(json.dumps(dict(meta, format=2)))  # a rerun refuses it too, and deletes nothing
    before = snapshot(out)
    assert prep("--source", "files:" + corpus[0], "--out_dir", out, *FILES_ARGS) == (
        f"prepare_data.py: error: {out} was prepared in format 2, this code writes 1; pass --force to rebuild it")
    assert snapshot(out) == before


def test_an_interrupted_repair_resumes(corpus, tmp_path, monkeypatch):
    """A rerun rebuilds a damaged val shard (val is checked as train is). A Ctrl-C during that repair leaves the
    folder marked incomplete, not a meta.json that lists the bad shard, and the next rerun finishes the repair
    with the tokenizer it has; so does one after a Ctrl-C while meta.json was being written (nothing is encoded
    again). A temporary file that a killed run left is removed."""
    pattern, _, good = corpus
    out = tmp_path / "d"
    shutil.copytree(good, out)
    args = ("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS)
    tokenizer_mtime = os.stat(out / "tokenizer.json").st_mtime_ns
    with open(out / pd.load_meta(out)["val_shards"][0]["file"], "r+b") as f:
        f.truncate(100)
    (out / "train_00042.bin.tmp").write_bytes(b"half a shard")  # what a kill -9 inside atomic_write leaves
    write_shard, write_json = pd.write_shard, pd.write_json

    def ctrl_c(*_):
        raise KeyboardInterrupt
    monkeypatch.setattr(pd, "write_shard", ctrl_c)
    assert prep(*args) == 130
    with pytest.raises(pd.DataError, match="is incomplete; re-run prepare_data.py with the same arguments to resume it$"):
        pd.load_meta(out)
    monkeypatch.setattr(pd, "write_shard", write_shard)
    monkeypatch.setattr(pd, "write_json", lambda path, obj, tmp=None:
                        ctrl_c() if path.endswith("meta.json") else write_json(path, obj, tmp))
    assert prep(*args) == 130
    monkeypatch.setattr(pd, "write_json", write_json)
    calls = []
    monkeypatch.setattr(pd, "write_shard", lambda path, tokens: (calls.append(path), write_shard(path, tokens)))
    assert prep(*args) is None and calls == []  # only meta.json was left to write
    assert {k: v[1] for k, v in snapshot(out).items()} == {k: v[1] for k, v in snapshot(good).items()}  # no *.tmp
    assert os.stat(out / "tokenizer.json").st_mtime_ns == tokenizer_mtime
    pd.load_tokens(out, "val")


def test_a_new_folder_and_files_that_changed(tmp_path, monkeypatch):
    """A start-over (the tokenizer files unreadable) removes the old shards: none of the old data stays beside
    the new when there are fewer shards now. A folder being made is locked against a train.py from the first
    shard. A resume refuses a file edited in place to the same size (its mtime tells)."""
    pattern, _ = write_corpus(tmp_path)
    out = tmp_path / "d"
    assert prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS) is None
    n_shards = len(pd.load_meta(out)["train_shards"])
    (out / "token_bytes.npy").write_bytes(b"")
    for txt in glob.glob(str(tmp_path / "corpus" / "*.txt")):  # 10 of the 48 documents
        os.remove(txt)
    assert prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS) is None
    meta = pd.load_meta(out)
    assert len(meta["train_shards"]) < n_shards
    assert {f for f in os.listdir(out) if ".bin" in f} == {s["file"] for s in meta["train_shards"] + meta["val_shards"]}

    new = tmp_path / "new"
    readers = []

    def first_shard(path, tokens):  # where a train.py could start reading
        try:
            pd.lock_folder(new, False, "busy").close()
            readers.append("let in")
        except pd.DataError:
            readers.append("kept out")
        raise KeyboardInterrupt
    monkeypatch.setattr(pd, "write_shard", first_shard)
    assert prep("--source", "files:" + pattern, "--out_dir", new, *FILES_ARGS) == 130
    assert readers == ["kept out"]
    jsonl = tmp_path / "corpus" / "a.jsonl"
    st, text = os.stat(jsonl), jsonl.read_bytes()
    jsonl.write_bytes(text.replace(b'"doc 3', b'"doc 4', 1))  # one byte, in place
    os.utime(jsonl, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    assert os.path.getsize(jsonl) == st.st_size
    before = snapshot(new)
    assert prep("--source", "files:" + pattern, "--out_dir", new, *FILES_ARGS) == (
        f"prepare_data.py: error: the files of files:{pattern} changed since {new} was begun; resuming would mix old "
        f"and new rows (val documents could land in train); pass --force to rebuild it")
    assert snapshot(new) == before


def test_what_a_preparation_counts(tmp_path, monkeypatch):
    """--val_tokens stops val at the first document that reaches it, counting each document's bos: 60 one-letter
    documents (2 tokens each, bos included) give exactly 10 val tokens in 5 documents. Empty documents are
    skipped, not prepared as a lone bos. --tokenizer_chars is the exact number of characters the BPE trains on."""
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(60):  # val candidates (even rows): one letter; training rows: 88 characters
            f.write(json.dumps({"text": chr(97 + i % 26) if i % 2 == 0 else f"training document {i:02d}. " * 4}) + "\n")
        for _ in range(4):
            f.write(json.dumps({"text": ""}) + "\n")
    seen = spy_on_bpe(monkeypatch)
    assert prep("--source", f"files:{tmp_path / 'docs.jsonl'}", "--out_dir", tmp_path / "out", "--vocab_size", 257,
                "--val_tokens", 10, "--tokenizer_chars", 1000) is None
    meta = pd.load_meta(tmp_path / "out")
    assert (meta["val_tokens"], meta["val_docs"]) == (10, 5)
    assert meta["train_docs"] + meta["val_docs"] == 60
    assert sum(map(len, seen)) == 1000


# -----------------------------------------------------------------------------
# a folder prepare_data.py did not write

def small_corpus(tmp_path):
    (tmp_path / "c").mkdir()
    for i, d in enumerate(make_docs(16)):
        (tmp_path / "c" / f"{i}.txt").write_text(d, encoding="utf-8")
    return ("--source", f"files:{tmp_path / 'c' / '*.txt'}", "--vocab_size", 300, "--val_tokens", 500,
            "--shard_tokens", 1000)


@pytest.mark.parametrize("name", ["train_00000.bin", "tokenizer.json", "token_bytes.npy", "meta.json.tmp"])
def test_a_file_named_like_ours_in_a_folder_we_did_not_prepare_is_refused_not_replaced(tmp_path, name):
    args = small_corpus(tmp_path)
    d = tmp_path / "d[1]"  # glob's special characters in the folder's name change nothing
    d.mkdir()
    (d / name).write_bytes(b"the user's own")
    (d / "notes.tmp").write_text("kept")
    if name.endswith(".tmp"):  # one of our temporary names: removed as ours, and the run goes on
        assert prep(*args, "--out_dir", d) is None
        assert not (d / name).exists()
    else:
        msg = prep(*args, "--out_dir", d)
        assert isinstance(msg, str) and "\n" not in msg
        assert name in msg and "not written by prepare_data.py" in msg and "--force" in msg
        assert (d / name).read_bytes() == b"the user's own"
        assert sorted(os.listdir(d)) == sorted([name, "notes.tmp", pd.LOCK])  # nothing written
        (d / "val_00003.bin").write_bytes(b"the user's too")
        assert prep(*args, "--out_dir", d, "--force") is None  # --force replaces them, and removes the rest
        meta = pd.load_meta(d)
        assert {f for f in os.listdir(d) if f.endswith(".bin")} == {s["file"] for s in meta["train_shards"] + meta["val_shards"]}
    pd.load_meta(d)
    assert (d / "notes.tmp").read_text() == "kept"


@pytest.mark.parametrize("left", [("token_bytes.npy",), ("token_bytes.npy", "tokenizer.json"), "all but meta.json"])
def test_an_older_versions_interrupted_run_starts_over(tmp_path, left, capsys):
    """An older prepare_data.py wrote the tokenizer files before its state file, and removed the state files first
    (--force, or a start-over): its interrupted runs could leave our files without a state file. They hold what
    we write, so a rerun starts over, not refuses them as a user's."""
    args = small_corpus(tmp_path)
    assert prep(*args, "--out_dir", tmp_path / "clean") is None
    d = tmp_path / "d"
    shutil.copytree(tmp_path / "clean", d)
    for f in os.listdir(d):
        if f == "meta.json" or (left != "all but meta.json" and f not in left and f != pd.LOCK):
            os.remove(d / f)
    pd.write_shard(str(d / "train_00099.bin"), np.array([0, 1, 2], dtype=np.uint16))  # a whole shard of ours, unlisted
    before = snapshot(d)
    assert prep("--source", f"files:{tmp_path / 'nothing' / '*.txt'}", *args[2:], "--out_dir", d) == \
        f"prepare_data.py: error: no files match '{tmp_path / 'nothing' / '*.txt'}'"
    assert snapshot(d) == before  # nothing removed before the source is found
    capsys.readouterr()
    assert prep(*args, "--out_dir", d) is None
    assert "files of an interrupted preparation without its state file; starting over" in capsys.readouterr().out
    assert {n: h for n, (_, h) in snapshot(d).items()} == {n: h for n, (_, h) in snapshot(tmp_path / "clean").items()}


def test_a_users_file_among_ours_or_a_folder_named_like_ours(tmp_path):
    """Our files beside one of the user's, named as ours but not holding what we write (an int64 .npy, a shard
    one byte short): refused, and nothing removed. A folder named like a shard is no file of ours: it stays."""
    args = small_corpus(tmp_path)
    assert prep(*args, "--out_dir", tmp_path / "clean") is None
    for name, content in (("token_bytes.npy", None), ("train_00000.bin", "short")):
        d = tmp_path / f"d_{name}"
        shutil.copytree(tmp_path / "clean", d)
        os.remove(d / "meta.json")
        if content is None:
            np.save(d / name, np.arange(5, dtype=np.int64))
        else:
            (d / name).write_bytes((d / name).read_bytes()[:-1])
        before = snapshot(d)
        msg = prep(*args, "--out_dir", d)
        assert msg.startswith(f"prepare_data.py: error: {d / name} was not written by prepare_data.py"), msg
        assert snapshot(d) == before
    d = tmp_path / "e"
    (d / "val_old.bin").mkdir(parents=True)
    assert prep(*args, "--out_dir", d) is None and (d / "val_old.bin").is_dir()
    assert prep(*args, "--out_dir", d, "--force") is None and (d / "val_old.bin").is_dir()


def test_force_waits_for_the_lock_of_a_folder_made_while_it_trained_its_tokenizer(tmp_path, monkeypatch):
    """--force on a folder that does not exist yet takes no lock at first; another run that makes and locks the
    folder meanwhile must keep its files: --force is refused as busy, removing nothing."""
    args = small_corpus(tmp_path)
    d, other, trained = tmp_path / "d", [], pd.new_tokenizer_json

    def meanwhile(source, config):
        d.mkdir()
        other.append(pd.lock_folder(str(d), True, "busy"))  # another run's lock (flock: per open file)
        (d / "progress.json").write_text("{}")
        (d / "train_00000.bin").write_bytes(b"theirs")
        return trained(source, config)
    monkeypatch.setattr(pd, "new_tokenizer_json", meanwhile)
    msg = prep(*args, "--out_dir", d, "--force")
    assert msg == f"prepare_data.py: error: {d} is in use: another prepare_data.py is writing it, or a train.py is reading it; wait for it to end"
    assert (d / "train_00000.bin").read_bytes() == b"theirs" and (d / "progress.json").exists()
    other[0].close()


@pytest.mark.parametrize("dies_at", [1, 2, 3, 4])  # progress.json, token_bytes.npy, tokenizer.json, the first shard
def test_a_fresh_run_killed_at_any_write_resumes_to_the_clean_folder(tmp_path, monkeypatch, dies_at):
    """The state file is written first, so that no killed run leaves our files without it (which a rerun would
    take for a user's files and refuse)."""
    args = small_corpus(tmp_path)
    assert prep(*args, "--out_dir", tmp_path / "clean") is None
    writes, atomic_write = [], pd.atomic_write

    def dies(path, write, tmp=None):
        writes.append(os.path.basename(path))
        if len(writes) == dies_at:
            raise KeyboardInterrupt
        atomic_write(path, write, tmp)
    monkeypatch.setattr(pd, "atomic_write", dies)
    assert prep(*args, "--out_dir", tmp_path / "d") == 130
    monkeypatch.setattr(pd, "atomic_write", atomic_write)
    assert prep(*args, "--out_dir", tmp_path / "d") is None
    assert writes[0] == "progress.json"
    clean, resumed = snapshot(tmp_path / "clean"), snapshot(tmp_path / "d")
    assert {k: v[1] for k, v in clean.items()} == {k: v[1] for k, v in resumed.items()}


def test_a_force_run_killed_while_it_removes_the_old_files_is_rerun(tmp_path, monkeypatch):
    """--force removes the state files last: a run killed after any removal leaves a folder that the same
    command, without --force, finishes (not one refused as holding files prepare_data.py did not write)."""
    args = small_corpus(tmp_path)
    assert prep(*args, "--out_dir", tmp_path / "clean") is None
    removed, remove = [], os.remove
    monkeypatch.setattr(pd.os, "remove", lambda path: (removed.append(os.path.basename(path)), remove(path)))
    assert prep(*args, "--out_dir", tmp_path / "clean", "--force") is None
    monkeypatch.setattr(pd.os, "remove", remove)
    removed = removed[:removed.index("meta.json") + 1]  # the --force removal (the run itself removes progress.json)
    assert len(removed) > 4 and "progress.json" not in removed  # shards, the tokenizer files, then meta.json
    for k in range(1, len(removed)):  # a kill after the k-th removal
        d = tmp_path / f"d{k}"
        shutil.copytree(tmp_path / "clean", d)
        for name in removed[:k]:
            os.remove(d / name)
        assert prep(*args, "--out_dir", d) is None, k
        assert {n: h for n, (_, h) in snapshot(d).items()} == {n: h for n, (_, h) in snapshot(tmp_path / "clean").items()}


@pytest.mark.parametrize("args, hint", [
    (["--out_dir", "out/try"], "unrecognized arguments: --out_dir out/try (nanoGPT's --out_dir is --ckpt here)"),
    (["--init_from=resume"], "unrecognized arguments: --init_from=resume (nanoGPT's --init_from is --ckpt here)"),
    (["--compile=True"], "argument --compile: ignored explicit argument 'True' (--compile is a switch: give it alone, "
                         "or leave it out)")])
def test_sample_names_ours_for_nanogpts_flags(args, hint, capsys):
    import sample
    with pytest.raises(SystemExit) as e:
        sample.main(args)
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == f"sample.py: error: {hint}"


# from a third mutation audit of prepare_data.py: the lock, the state checks, the sources' errors, the printed numbers

def test_force_under_a_reader_is_refused_and_removes_nothing(corpus, tmp_path, capsys):
    """--force needs the folder to itself: under a train.py's shared lock it is refused at once, before a tokenizer
    is trained and with every file kept (a shared lock, as a plain rerun takes, would let it delete the data being
    read). The rerun refused under a reader prints nothing of a start-over it does not make (unreadable tokenizer files)."""
    pattern, _, good = corpus
    out = tmp_path / "d"
    shutil.copytree(good, out)
    busy = (f"prepare_data.py: error: {out} is in use: another prepare_data.py is writing it, or a train.py is reading it; "
            f"wait for it to end")
    before = snapshot(out)
    with pd.lock_folder(str(out), False, "busy"):
        assert prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS, "--force") == busy
        assert snapshot(out) == before
        (out / "token_bytes.npy").write_bytes(b"")  # a rerun alone would start over
        capsys.readouterr()
        assert prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS) == busy
        assert capsys.readouterr().out == ""


def test_a_failed_run_removes_only_the_folders_it_made(tmp_path):
    """A run that fails after making --out_dir removes the folders it made, not an (empty) one that was there."""
    args = small_corpus(tmp_path)
    (tmp_path / "mine").mkdir()
    assert "only supports" in prep(*args[:2], "--vocab_size", 200000, "--out_dir", tmp_path / "mine" / "new" / "data")
    assert os.listdir(tmp_path / "mine") == []


def test_more_damaged_state_files_are_refused_in_one_line(corpus, tmp_path):
    """meta.json / progress.json that are JSON but not what prepare_data.py writes: a shard entry without a file
    name, a shard list that is not a list, no config (or not a dict), no token_bytes name, a bos_id the tokenizer
    does not have, an int64 token_bytes.npy: each a DataError naming the file, never a traceback."""
    pattern, _, good = corpus
    out = tmp_path / "d"
    shutil.copytree(good, out)
    meta_json = out / "meta.json"
    meta = json.loads(meta_json.read_text())
    rerun = lambda: prep("--source", "files:" + pattern, "--out_dir", out, *FILES_ARGS)

    def said(call):  # the rerun's exit message, or the loading API's DataError
        try:
            return call()
        except pd.DataError as e:
            return str(e)
    for edit, call, message in (
            (dict(train_shards=meta["train_shards"] + [{"tokens": 5}]), lambda: pd.load_tokens(out, "train"),
             f"{meta_json} lists a train shard without a file name, token and document counts and end row; re-run prepare_data.py with --force"),
            (dict(val_shards={}), rerun, f"prepare_data.py: error: {meta_json} lists a val shard without a file name, "
                                         f"token and document counts and end row; pass --force to rebuild {out}"),
            (dict(config=None), rerun, f"prepare_data.py: error: {meta_json} has no config (or not a dict); pass "
                                       f"--force to rebuild {out}"),
            # fields a rerun or the loading API reads, gone or of another type (an edited file, an older version's):
            # they were KeyErrors and ValueErrors, in prepare_data.py and in train.py
            ({"val_done": None}, rerun, f"prepare_data.py: error: {meta_json} has no val_done (or not true or false); "
                                        f"pass --force to rebuild {out}"),
            ({"bos_id": None}, rerun, f"prepare_data.py: error: {meta_json} has no bos_id (or not a whole number); "
                                      f"pass --force to rebuild {out}"),
            ({"dtype": "int8"}, rerun, f"prepare_data.py: error: {meta_json} has dtype 'int8', not uint16 or uint32; pass --force to rebuild {out}"),
            ({"train_tokens": "x"}, lambda: pd.load_meta(out),
             f"{meta_json} has no train_tokens (or not a whole number); re-run prepare_data.py with --force"),
            # JSON's true is a Python bool, which is an int: bos_id true read as token 1 (mutant P23: bools let through)
            ({"bos_id": True}, lambda: pd.load_meta(out),
             f"{meta_json} has no bos_id (or not a whole number); re-run prepare_data.py with --force"),
            ({"val_docs": None}, rerun, f"prepare_data.py: error: {meta_json} has no val_docs (or not a whole number); "
                                        f"pass --force to rebuild {out}"),
            ({"val_end_row": None}, rerun, f"prepare_data.py: error: {meta_json} has no val_end_row (or not a whole number); "
                                           f"pass --force to rebuild {out}"),
            (dict(train_shards=[{k: v for k, v in s.items() if k != "end_row"} for s in meta["train_shards"]]), rerun,
             f"prepare_data.py: error: {meta_json} lists a train shard without a file name, token and document counts and "
             f"end row; pass --force to rebuild {out}"),
            # an argument this version records and the folder's did not: named, not a StopIteration
            (dict(config={k: v for k, v in meta["config"].items() if k != "hf_split"}), rerun,
             f"prepare_data.py: error: {out} holds data prepared with other arguments (hf_split: not recorded, now None); "
             f"use another --out_dir or pass --force to rebuild it"),
            ({"token_bytes": None}, lambda: pd.load_token_bytes(out),
             f"{meta_json} has no token_bytes (or not a string); re-run prepare_data.py with --force"),
            (dict(bos_id=0), lambda: pd.load_tokenizer(out),
             f"{out / 'tokenizer.json'} does not match {out}/meta.json; re-run prepare_data.py with --force")):
        meta_json.write_text(json.dumps(dict(meta, **edit)))
        assert said(call) == message
        meta_json.write_text(json.dumps(meta))
    no_config = {k: v for k, v in meta.items() if k != "config"}
    meta_json.write_text(json.dumps(no_config))
    assert rerun() == f"prepare_data.py: error: {meta_json} is not a prepare_data.py state file; pass --force to rebuild {out}"
    meta_json.write_text(json.dumps(meta))
    np.save(out / "token_bytes.npy", pd.load_token_bytes(out).astype(np.int64))
    with pytest.raises(pd.DataError) as e:
        pd.load_token_bytes(out)
    assert str(e.value) == (f"{out / 'token_bytes.npy'} has shape (512,) int64, expected (512,) int32; "
                            f"re-run prepare_data.py with --force")


def test_a_users_tokenizer_json_is_not_taken_for_ours(tmp_path):
    """A Hugging Face tokenizer.json (a JSON object, but not ours) in a folder without a state file is the user's:
    refused, not removed as an interrupted run's."""
    args = small_corpus(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    theirs = json.dumps({"version": "1.0", "added_tokens": [], "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})
    (d / "tokenizer.json").write_text(theirs)
    msg = prep(*args, "--out_dir", d)
    assert msg.startswith(f"prepare_data.py: error: {d / 'tokenizer.json'} was not written by prepare_data.py"), msg
    assert (d / "tokenizer.json").read_text() == theirs


def test_the_gpt2_ranks_are_stored_by_id_and_a_trainer_with_holes_is_refused(tmp_path, monkeypatch):
    """tokenizer.json lists token bytes by id: tiktoken's gpt2 ranks are sorted by rank whatever their dict order.
    A BPE trainer whose ranks skip an id is refused (its ids would shift), not stored."""
    import rustbpe
    import tiktoken_ext.openai_public as openai_public
    ranks = [bytes([i]) for i in range(256)] + [b"ab", b"cd"]
    fake = {"name": "gpt2", "pat_str": openai_public.r50k_pat_str, "special_tokens": {"<|endoftext|>": len(ranks)},
            "mergeable_ranks": {b: i for i, b in reversed(list(enumerate(ranks)))}}
    monkeypatch.setattr(openai_public, "gpt2", lambda: fake)
    monkeypatch.setattr(pd, "_gpt2_cached", lambda: True)
    tok = pd.gpt2_tokenizer_json()
    assert [base64.b64decode(r) for r in tok["ranks"]] == ranks and tok["bos_id"] == 258

    class Holes:  # 257 ranks, as asked, but 255 is missing
        def train_from_iterator(self, texts, vocab_size, pattern):
            for _ in texts:
                pass

        def get_mergeable_ranks(self):
            return [(bytes([i]), i) for i in range(256) if i != 255] + [(b"\xff", 256), (b"ab", 257)]
    monkeypatch.setattr(rustbpe, "Tokenizer", Holes)
    args = small_corpus(tmp_path)
    msg = prep(*args[:2], "--vocab_size", 258, "--val_tokens", 500, "--out_dir", tmp_path / "d")
    assert msg == ("prepare_data.py: error: rustbpe returned token ids that are not 0..256; install the version that "
                   "requirements.txt pins")


def test_more_bad_rows_and_files_are_one_line(tmp_path):
    """A .jsonl row that is not an object (a string that contains the column's name), a parquet column of numbers or
    without the column, a file of another type: one line each."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    (tmp_path / "str.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps("a text, not an object") + "\n")
    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "int.parquet")
    pq.write_table(pa.table({"body": ["fine", "also fine"]}), tmp_path / "body.parquet")
    (tmp_path / "rows.csv").write_text("text\nfine\n")
    files = lambda name: "files:" + str(tmp_path / name)
    for source, expected in ((files("str.jsonl"), f"{tmp_path / 'str.jsonl'}:2: no 'text' field (set --column)"),
                             (files("int.parquet"), f"{files('int.parquet')}: column 'text' holds int, not text"),
                             (files("body.parquet"), f"{tmp_path / 'body.parquet'}: no column 'text' (has ['body']; set --column)"),
                             (files("*"), f"{tmp_path / 'rows.csv'}: unsupported file type (use .txt/.md, .jsonl or .parquet)")):
        assert prep("--source", source, "--vocab_size", 300, "--out_dir", tmp_path / "out") == f"prepare_data.py: error: {expected}"
        assert not (tmp_path / "out").exists()


class HubStream:
    """What datasets.load_dataset(..., streaming=True) returns, for the rows given."""
    def __init__(self, rows):
        self.rows = rows
        self.column_names = list(rows[0])

    def select_columns(self, columns):  # as datasets': a column it does not have is a ValueError
        if not set(columns) <= set(self.column_names):
            raise ValueError(f"Column(s) {columns} not in the dataset")
        return [{c: row[c] for c in columns} for row in self.rows]


def test_the_hub_source_asks_for_its_name_config_and_split(tmp_path, monkeypatch):
    """hf:NAME[:CONFIG] and --hf_split reach load_dataset (streamed); a column the dataset lacks, numbers where text
    should be, and hf: without a name are one line each, before anything is written."""
    import datasets
    asked, rows = [], [{"text": f"document {i} " * 30, "n": i} for i in range(12)]
    monkeypatch.setattr(pd, "_check_hub", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: asked.append((a, k)) or HubStream(rows))
    args = ("--vocab_size", 257, "--val_tokens", 100)
    assert prep("--source", "hf:someone/data:cfg", "--hf_split", "validation", *args, "--out_dir", tmp_path / "h") is None
    assert asked[0] == (("someone/data", "cfg"), {"split": "validation", "streaming": True})
    assert pd.load_meta(tmp_path / "h")["train_docs"] + pd.load_meta(tmp_path / "h")["val_docs"] == 12
    asked.clear()
    for source, column, expected in (
            ("hf:someone/data", "body", "someone/data has no column 'body' (has ['text', 'n']; set --column)"),
            ("hf:someone/data", "n", "hf:someone/data: column 'n' holds int, not text"),
            ("hf:", "text", "--source=hf:NAME needs a dataset name, e.g. hf:roneneldan/TinyStories")):
        assert prep("--source", source, "--column", column, *args, "--out_dir", tmp_path / "x") == \
            f"prepare_data.py: error: {expected}"
        assert not (tmp_path / "x").exists()
    assert [a for a, _ in asked] == [("someone/data", None)] * 2  # no config: None, not ''; hf: never reached the hub


@pytest.mark.parametrize("argv, expected", [
    (["--source=files:x", "--hf_split=test"], "--hf_split applies to hf: sources only"),
    (["--source=climbmix", "--hf_split=test"], "--hf_split applies to hf: sources only"),
    (["--source=climbmix", "--column=body"], "--column applies to hf: and files: sources, not climbmix"),
    (["--column=body"], "--column applies to hf: and files: sources, not shakespeare"),
    (["--source=files:x", "--tokenizer=gpt2", "--vocab_size=1000"], "--tokenizer=gpt2 has a fixed vocab of 50257; drop --vocab_size"),
    (["--source=files:x", "--tokenizer=gpt2", "--tokenizer_chars=1000"], "--tokenizer_chars applies to --tokenizer=bpe only"),
    (["--vocab_size=256"], "--vocab_size must be at least 257 (256 bytes + bos) and at most 2^32 (uint32 token ids)")])
def test_flags_that_do_not_apply_are_refused(argv, expected):
    with pytest.raises(pd.DataError) as e:
        pd.resolve_config(pd.parse_args(argv))
    assert str(e.value) == expected


def test_each_sources_defaults():
    """The paper's climbmix numbers (vocab 32768, 2.2e9 train / 41.9e6 val tokens), and each source's folder:
    an hf: dataset's is named after the dataset, without its owner, config or a trailing slash."""
    def config(*argv):
        c, out = pd.resolve_config(pd.parse_args(list(argv)))
        return out, c["vocab_size"], c["train_tokens"], c["val_tokens"], c["hf_split"], c["column"]
    assert config("--source=climbmix") == ("data/climbmix", 32768, 2_200_000_000, 41_900_000, "train", "text")
    assert config() == ("data/shakespeare", 4096, None, None, None, None)
    assert config("--source=files:x") == ("data/files", 32768, None, 1_000_000, None, "text")
    assert config("--source=hf:roneneldan/TinyStories:cfg") == ("data/TinyStories", 32768, None, 1_000_000, "train", "text")
    assert config("--source=hf:/datasets/mine/")[0] == "data/mine"
    assert config("--source=files:x", "--tokenizer=gpt2")[1] == 50257


def test_atomic_write_syncs_then_renames_and_keeps_the_old_file_on_a_failure(tmp_path, monkeypatch):
    path = str(tmp_path / "meta.json")
    events, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", a, b)), replace(a, b)))
    pd.write_json(path, {"old": 1})
    assert events == [("fsync", path + ".tmp"), ("replace", path + ".tmp", path)]
    monkeypatch.undo()

    def fails(f):
        f.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(OSError):
        pd.atomic_write(path, fails)
    assert json.loads(open(path).read()) == {"old": 1} and os.listdir(tmp_path) == ["meta.json"]
    (tmp_path / "fig.png").mkdir()  # the rename fails: the error names the path given, not the temporary
    with pytest.raises(IsADirectoryError) as e:
        pd.atomic_write(str(tmp_path / "fig.png"), lambda f: f.write(b"png"), str(tmp_path / "fig.png.tmp123"))
    assert (e.value.filename, e.value.filename2) == (str(tmp_path / "fig.png"), None)
    assert sorted(os.listdir(tmp_path)) == ["fig.png", "meta.json"]


def test_the_numbers_a_preparation_prints(tmp_path, capsys):
    """The summary lines: the tokenizer's vocabulary, each split's tokens and documents, the UTF-8 megabytes encoded,
    what a rerun finds; no 'ran out' note when a budget is met exactly, the train one when it is not."""
    with open(tmp_path / "docs.jsonl", "w") as f:  # val candidates: 'x' (2 tokens with bos); training rows: 37,501 tokens
        for i in range(8):
            f.write(json.dumps({"text": "x" if i % 2 == 0 else "é " * 12500}) + "\n")
    args = ("--source", f"files:{tmp_path / 'docs.jsonl'}", "--vocab_size", 257, "--val_tokens", 4)
    out = tmp_path / "out"
    assert prep(*args, "--out_dir", out) is None
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"trained BPE tokenizer, vocab 257, in \d+\.\ds", lines[0]), lines
    assert re.fullmatch(rf"prepared {re.escape(str(out))}: 150,008 train tokens \(6 docs\), 4 val tokens \(2 docs\) "
                        rf"in \d+\.\ds, encoded 0\.2 MB at \d+\.\d MB/s", lines[-1]), lines
    assert len(lines) == 2  # val met exactly, train unbounded: no note
    assert prep(*args, "--out_dir", out) is None
    assert capsys.readouterr().out == f"{out} is already prepared (150,008 train / 4 val tokens); nothing to do\n"
    assert prep(*args, "--train_tokens", 10 ** 6, "--out_dir", tmp_path / "more") is None
    assert ("note: the source ran out: train has 150,008 tokens, not the 1,000,000 asked for (see --train_tokens)"
            in capsys.readouterr().out.splitlines())


def test_a_resumed_progress_bar_counts_the_documents_already_done(tmp_path, monkeypatch, capsys):
    """The encode bar's 'N docs' counts the split's documents, those of the shards a resume kept included."""
    pattern, _ = write_corpus(tmp_path)
    args = ("--source", "files:" + pattern, *FILES_ARGS, "--out_dir", tmp_path / "d")
    calls, write_shard = [], pd.write_shard

    def dies_on_third(path, tokens):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        write_shard(path, tokens)
    monkeypatch.setattr(pd, "write_shard", dies_on_third)
    assert prep(*args) == 130
    monkeypatch.setattr(pd, "write_shard", write_shard)
    capsys.readouterr()
    assert prep(*args) is None
    shown = re.findall(r"encode train[^\r\n]*?(\d+) docs", capsys.readouterr().err)
    assert shown and int(shown[-1]) == pd.load_meta(tmp_path / "d")["train_docs"]


def test_a_lock_file_that_cannot_be_opened_is_one_line(tmp_path, monkeypatch):
    """A writable out_dir whose .lock cannot be opened (a folder by that name here) is refused before any work: the
    run went unlocked and ended in an AttributeError traceback after writing meta.json. A read-only folder (os.access
    stands in for one: the tests run as root) takes no lock: nobody writes there."""
    out = tmp_path / "d"
    (out / ".lock").mkdir(parents=True)
    msg = prep(*small_corpus(tmp_path), "--out_dir", out)
    assert msg == (f"prepare_data.py: error: cannot open the lock file {out / '.lock'} (Is a directory); remove it, if no "
                   f"run is using {out}")
    assert sorted(os.listdir(out)) == [".lock"]
    real_access = os.access
    monkeypatch.setattr(pd.os, "access", lambda path, mode: mode != os.W_OK and real_access(path, mode))
    assert pd.lock_folder(str(out), False, "busy") is None
