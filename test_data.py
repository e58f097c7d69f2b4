"""Tests of prepare_data.py: the Shakespeare default, token for token; the folder's contract; streamed sources;
re-runs and settings; the unreachable download. Run: OMP_NUM_THREADS=1 python -m pytest -q test_data.py"""
import base64
import json
import os
import shutil

import numpy as np
import pytest

import prepare_data as pd
from model import load_tokenizer

PLAYS = dict(pd.shakespeare_plays())
TEXT = "Naïve café in Zürich, 東京 and Ελλάδα 🚀 — x² ½\n\t 1234567 don't  WE'LL\r\n"


def read(d):
    """meta.json, the Encoding and token_bytes.npy of a prepared folder d."""
    meta = json.load(open(d / "meta.json"))
    return meta, load_tokenizer(json.load(open(d / "tokenizer.json"))), np.load(d / "token_bytes.npy")


def tokens(d, split):
    """A split's shards as one array, read as train.py reads them."""
    meta = json.load(open(d / "meta.json"))
    return np.concatenate([np.memmap(d / f, dtype=meta["dtype"], mode="r") for f in meta[split + "_files"]])


def documents(d, split):
    """A split's documents, each as its token ids without the bos that leads it; every shard starts with bos."""
    meta = json.load(open(d / "meta.json"))
    docs = []
    for f in meta[split + "_files"]:
        shard = np.memmap(d / f, dtype=meta["dtype"], mode="r")
        starts = list(np.flatnonzero(shard == meta["bos_id"]))
        assert starts[0] == 0
        docs += [shard[a + 1:b] for a, b in zip(starts, starts[1:] + [len(shard)])]
    return docs


def mtimes(d):
    return {name: os.stat(d / name).st_mtime_ns for name in sorted(os.listdir(d))}


def refused(argv):
    """The one-line message of a run that prepare_data.py refuses."""
    with pytest.raises(SystemExit) as e:
        pd.main([str(a) for a in argv])
    assert isinstance(e.value.code, str) and "\n" not in e.value.code
    return e.value.code


# -----------------------------------------------------------------------------
# The Shakespeare default


def test_the_default_is_the_published_tokenization(tmp_path, monkeypatch):
    """`python prepare_data.py`: the tokens of the project's published CPU results (the pre-rewrite counts)."""
    monkeypatch.chdir(tmp_path)
    pd.main([])
    d = tmp_path / "data" / "shakespeare"
    meta, enc, token_bytes = read(d)
    assert (meta["vocab_size"], meta["bos_id"], meta["dtype"], enc.n_vocab) == (4096, 4095, "uint16", 4096)
    assert (meta["train_tokens"], meta["val_tokens"]) == (1_397_523, 108_723)
    assert (meta["train_docs"], meta["val_docs"]) == (35, 3)
    assert (meta["train_files"], meta["val_files"]) == (["train_0000.bin"], ["val_0000.bin"])
    assert sorted(os.listdir(d)) == ["meta.json", "token_bytes.npy", "tokenizer.json", "train_0000.bin",
                                     "val_0000.bin"]
    assert os.path.getsize(d / "train_0000.bin") == 2 * 1_397_523  # raw uint16: no header
    assert token_bytes.shape == (4096,) and token_bytes.dtype == np.int32 and token_bytes[4095] == 0
    assert json.load(open(d / "tokenizer.json"))["pattern"] == pd.SPLIT_PATTERN


@pytest.mark.parametrize("split", ["train", "val"])
def test_documents_are_whole_plays_led_by_bos(data_dir, split):
    """Validation is Macbeth, Twelfth Night and Richard II, whole; training the other 35 plays, in order."""
    meta, enc, _ = read(data_dir)
    names = [name for name in PLAYS if (name in pd.VAL_PLAYS) == (split == "val")]
    docs = documents(data_dir, split)
    assert [enc.decode_bytes(doc.tolist()).decode() for doc in docs] == [PLAYS[n] for n in names]
    assert [doc.tolist() for doc in docs] == [enc.encode_ordinary(PLAYS[n]) for n in names]
    assert meta[split + "_docs"] == len(names) == (3 if split == "val" else 35)
    assert meta[split + "_tokens"] == len(tokens(data_dir, split)) == sum(len(doc) + 1 for doc in docs)


def test_token_bytes_count_utf8_bytes_and_the_tokenizer_round_trips(data_dir):
    """Bits per byte: a text's tokens' byte lengths sum to its UTF-8 length (bos counts 0)."""
    _, enc, token_bytes = read(data_dir)
    all_tokens = np.concatenate([tokens(data_dir, "train"), tokens(data_dir, "val")])
    assert token_bytes[all_tokens].sum() == sum(len(t.encode()) for t in PLAYS.values())
    ids = enc.encode_ordinary(TEXT)
    assert enc.decode(ids) == TEXT and token_bytes[ids].sum() == len(TEXT.encode())
    ranks = json.load(open(data_dir / "tokenizer.json"))["ranks"]
    assert token_bytes.tolist() == [len(base64.b64decode(r)) for r in ranks] + [0]


@pytest.mark.parametrize("vocab_size, dtype", [(50257, "uint16"), (65536, "uint16"), (65537, "uint32")])
def test_token_ids_past_65536_are_uint32(vocab_size, dtype):
    assert pd.token_dtype(vocab_size) == dtype  # 65,536 ids: the last, bos, is 65,535


# -----------------------------------------------------------------------------
# Re-runs and settings


def test_a_rerun_carries_on_after_the_written_shards(data_dir, tmp_path, monkeypatch, capsys):
    """A run killed while writing its third training shard; the same command writes only what is missing (no
    tokenizer, no finished shard again), and gives the clean run's tokens; then a re-run does nothing."""
    argv = ["--vocab_size", "512", "--train_tokens", "6e5", "--shard_tokens", "2e5", "--out_dir", str(tmp_path)]
    save = pd.save

    def killed(path, write):
        if path.endswith("train_0002.bin"):
            raise KeyboardInterrupt
        save(path, write)
    monkeypatch.setattr(pd, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        pd.main(argv)
    before = mtimes(tmp_path)
    del before["progress.json"]
    assert sorted(before) == ["token_bytes.npy", "tokenizer.json", "train_0000.bin", "train_0001.bin",
                              "val_0000.bin"]
    monkeypatch.setattr(pd, "save", save)
    monkeypatch.setattr(pd, "train_bpe", lambda args: pytest.fail("the tokenizer was trained again"))
    pd.main(argv)
    after = mtimes(tmp_path)
    assert {k: after[k] for k in before} == before  # nothing written again
    assert sorted(after) == sorted([*before, "meta.json", "train_0002.bin"])
    clean = tokens(data_dir, "train")
    train = tokens(tmp_path, "train")
    assert np.array_equal(train, clean[:len(train)]) and clean[len(train)] == 511  # whole documents
    assert len(train) >= 600_000 > len(train) - len(documents(tmp_path, "train")[-1]) - 1
    assert np.array_equal(tokens(tmp_path, "val"), tokens(data_dir, "val"))
    capsys.readouterr()
    pd.main(argv)
    assert mtimes(tmp_path) == after
    assert capsys.readouterr().out == (f"{tmp_path} is already prepared: {len(train):,} train and 177,962 val "
                                        "tokens\n")


@pytest.mark.parametrize("argv, change", [(["--vocab_size", 600], "vocab_size: 512, now 600"),
                                          (["--source", "climbmix"], "source: 'shakespeare', now 'climbmix'"),
                                          (["--shard_tokens", 1000], "shard_tokens: 100000000, now 1000")])
def test_other_settings_on_a_folder_are_refused(data_dir, tmp_path, argv, change):
    d = shutil.copytree(data_dir, tmp_path / "d")
    before = mtimes(d)
    assert refused(["--out_dir", d, "--vocab_size", 512] + argv) == (
        f"prepare_data.py: {d} holds data prepared with other settings ({change}); use another --out_dir, "
        f"or --force to replace it")
    assert mtimes(d) == before


def test_force_replaces_a_folder(tmp_path):
    """--force prepares the folder again with the new settings; the old shards go."""
    argv = ["--out_dir", str(tmp_path), "--vocab_size", "300", "--tokenizer_chars", "1e5",
            "--train_tokens", "1e5"]
    pd.main(argv + ["--shard_tokens", "1"])  # a shard per document
    assert len(json.load(open(tmp_path / "meta.json"))["val_files"]) == 3
    pd.main(argv + ["--force"])
    meta = json.load(open(tmp_path / "meta.json"))
    assert meta["settings"]["shard_tokens"] == 100_000_000 and meta["val_files"] == ["val_0000.bin"]
    assert sorted(os.listdir(tmp_path)) == ["meta.json", "token_bytes.npy", "tokenizer.json", "train_0000.bin",
                                            "val_0000.bin"]


# -----------------------------------------------------------------------------
# Streamed sources and the GPT-2 tokenizer


def test_a_stream_holds_out_every_other_document_until_val_is_full(tmp_path, monkeypatch):
    """hf:NAME streams with datasets (here a local folder, as climbmix would): val takes the even rows from the
    start until it has --val_tokens; train the rest, in order; the BPE trains on the first --tokenizer_chars
    characters of the odd rows only. Empty documents are skipped."""
    import rustbpe
    rows = [f"row {i}: " + " ".join(f"w{i * j % 97}" for j in range(40 + i)) for i in range(60)]
    rows[9] = ""
    (tmp_path / "corpus").mkdir()
    with open(tmp_path / "corpus" / "docs.jsonl", "w") as f:
        f.writelines(json.dumps({"body": r}) + "\n" for r in rows)
    seen, Tokenizer = [], rustbpe.Tokenizer

    class Spy:  # rustbpe's trainer, recording the text it is given
        def __init__(self):
            self.bpe = Tokenizer()

        def train_from_iterator(self, texts, *args, **kwargs):
            seen.extend(texts)
            self.bpe.train_from_iterator(iter(seen), *args, **kwargs)

        def get_mergeable_ranks(self):
            return self.bpe.get_mergeable_ranks()
    monkeypatch.setattr(rustbpe, "Tokenizer", Spy)
    d = tmp_path / "d"
    pd.main(["--source", f"hf:{tmp_path / 'corpus'}", "--column", "body", "--out_dir", str(d), "--vocab_size",
             "300", "--tokenizer_chars", "3000", "--val_tokens", "500", "--shard_tokens", "2000"])
    odd, chars = [], 0
    for r in rows[1::2]:
        if r and chars < 3000:  # the odd rows until 3,000 characters, the last one cut
            odd.append(r[:3000 - chars])
            chars += len(odd[-1])
    assert seen == odd and 1 < len(odd) < 30
    meta, enc, _ = read(d)
    val, total = [], 0
    for i in range(0, 60, 2):
        if total < 500:
            val.append(i)
            total += len(enc.encode_ordinary(rows[i])) + 1
    train = [r for i, r in enumerate(rows) if i not in val and r]
    assert 1 < len(val) < 30 and meta["val_end"] == val[-1] + 1
    assert [enc.decode(doc.tolist()) for doc in documents(d, "val")] == [rows[i] for i in val]
    assert [enc.decode(doc.tolist()) for doc in documents(d, "train")] == train
    assert len(meta["train_files"]) > 1


def test_the_gpt2_tokenizer_is_stored_by_id_with_endoftext_last(tmp_path, monkeypatch):
    """--tokenizer=gpt2 writes tiktoken's ranks in id order, bos <|endoftext|> after them (here a small stand-in
    for GPT-2's files, given in shuffled order), and encodes as tiktoken does."""
    import tiktoken
    import tiktoken_ext.openai_public as openai_public
    ranks = [bytes([i]) for i in range(256)] + [b"th", b"the", b" the", b"an", b"and"]
    order = np.random.default_rng(0).permutation(len(ranks))
    spec = dict(name="gpt2", pat_str=openai_public.r50k_pat_str, special_tokens={"<|endoftext|>": len(ranks)},
                mergeable_ranks={ranks[i]: int(i) for i in order})
    monkeypatch.setattr(openai_public, "gpt2", lambda: spec)
    d = tmp_path / "d"
    pd.main(["--tokenizer", "gpt2", "--out_dir", str(d), "--train_tokens", "1000"])
    tok = json.load(open(d / "tokenizer.json"))
    assert [base64.b64decode(r) for r in tok["ranks"]] == ranks and tok["bos"] == "<|endoftext|>"
    meta, enc, _ = read(d)
    bos = enc.encode("<|endoftext|>", allowed_special="all")
    assert (meta["bos_id"], meta["vocab_size"]) == (261, 262) == (bos[0], enc.n_vocab)
    gpt2 = tiktoken.Encoding(**spec)
    assert [doc.tolist() for doc in documents(d, "val")] == [gpt2.encode_ordinary(PLAYS[n]) for n in PLAYS
                                                            if n in pd.VAL_PLAYS]


@pytest.mark.parametrize("argv, says", [
    (["--source", "climbmix"], "prepare_data.py: Couldn't reach 'karpathy/climbmix-400b-shuffle' on the Hub"),
    (["--tokenizer", "gpt2"], "prepare_data.py: GPT-2's tokenizer files (openaipublic.blob.core.windows.net) "
                              "cannot be reached")])
def test_an_unreachable_download_is_one_line(tmp_path, monkeypatch, argv, says):
    """Offline: the hub as HF_HUB_OFFLINE=1 sets it; GPT-2's files not in tiktoken's cache, and requests failing
    to connect as it does without a network. One line that says how to run offline; nothing written."""
    import datasets
    import requests

    def no_network(url, *args, **kwargs):
        raise requests.ConnectionError(f"Max retries exceeded with url: {url} (Failed to resolve host)")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(requests, "get", no_network)
    msg = refused(argv + ["--out_dir", tmp_path / "d"])
    assert msg.startswith(says)
    assert msg.endswith("; without a network, run `python prepare_data.py` (the Shakespeare default)")
    assert not (tmp_path / "d").exists()
