"""Shared test setup: one CPU thread per process (the suite runs as `pytest -n 2` on 2 cores, and the scripts
a test starts inherit it), tiny models, a byte-level tokenizer and one tiny checkpoint per session."""
import base64
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from model import GPT, GPTConfig  # noqa: E402

# tokenizer.json of a byte-level tokenizer: 256 byte tokens, then <|bos|> = 256
BYTE_TOKENIZER = {"pattern": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                  "bos": "<|bos|>", "ranks": [base64.b64encode(bytes([i])).decode() for i in range(256)]}


def tiny(variant="bov", **overrides):
    """A 6-layer model of width 48 (4 heads of 12) over the byte tokenizer's 257 ids: the cpu size, shrunk."""
    shape = dict(n_embd=48, n_head=4, vocab_size=257, block_size=64)
    return GPTConfig.preset("cpu", variant, **{**shape, **overrides})


def seeded(seed, variant="bov", **overrides):
    """tiny(variant) initialised from torch.manual_seed(seed), with the zero-initialised output projections made
    non-zero (from their own generator), so that every layer's values reach the logits."""
    torch.manual_seed(seed)
    model = GPT(tiny(variant, **overrides))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.c_proj.weight.normal_(0, 0.2, generator=g)
            block.mlp.c_proj.weight.normal_(0, 0.2, generator=g)
        model.lm_head.weight.normal_(0, 0.2, generator=g)
    return model.eval()


def save_checkpoint(model, path, **extra):
    """A checkpoint as train.py writes one (the fields sample.py, eval.py and bench.py read)."""
    from dataclasses import asdict
    torch.save({"model": model.state_dict(), "model_config": asdict(model.config), "tokenizer": BYTE_TOKENIZER,
                **extra}, path)
    return path


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """One tiny BoV checkpoint for the session: out_dir/ckpt.pt, returned as the out_dir."""
    out = tmp_path_factory.mktemp("out")
    save_checkpoint(seeded(0, "bov"), out / "ckpt.pt", step=0)
    return out


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The Shakespeare default with a 512-token BPE, prepared once per session by prepare_data.py: its folder."""
    import prepare_data
    out = tmp_path_factory.mktemp("data") / "shakespeare"
    prepare_data.main(["--out_dir", str(out), "--vocab_size", "512"])
    return out
