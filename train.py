"""
Train a GPT, standard or Bank of Values, on a FLOP budget as the paper does (its Table 6).

    python train.py                                       # size cpu, BoV, Shakespeare: minutes on 2 CPU cores
    python train.py --variant=baseline                    # the same FLOPs for standard attention
    python train.py config/paper_135m.py --variant=baseline --dry_run     # the plan only
    torchrun --standalone --nproc_per_node=8 train.py config/paper_135m.py --variant=bov

Settings as in nanoGPT: the defaults below, then config files (Python assignments) and --key=value (a Python
literal, else text; a bare --flag is True) in the order given. Any GPTConfig field is a key too
(--bov_layers=3,4,5). `--help` prints the settings a command resolves to.
"""

import ast
import bisect
import ctypes
import json
import math
import os
import random
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# Settings. The defaults are the offline run: size cpu, ~0.5M tokens of Shakespeare, a few minutes on 2 cores.
size = "cpu"                  # model.SIZES: cpu | paper_135m | paper_780m
variant = "bov"               # model.VARIANTS: baseline | bov | t1_r01 .. t1_r13 | ...
data_dir = "data/shakespeare"  # prepare_data.py's folder
out_dir = ""                  # default: out/<size>_<variant>
# the budget: exactly one decides the iterations (setting one clears the other two)
target_flops = 1.15e13        # FLOPs = estimate_flops() x tokens: the paper's compute control
target_tokens = 0
max_iters = 0
total_batch_tokens = 4096     # tokens per step = device_batch_size x block_size x accumulation x ranks
device_batch_size = 16        # sequences per forward pass
# optimisation: Table 6's 135M peak rates (table_lr: Section 5); configure_optimizers scales AdamW's by width
matrix_lr = 0.02              # Muon: every 2-D block matrix
embedding_lr = 0.30           # AdamW: wte
unembedding_lr = 0.008        # AdamW: lm_head
scalar_lr = 0.50              # AdamW: gamma_v, or alpha_v and beta_v
table_lr = 0.15               # AdamW: the value tables
weight_decay = 0.28           # Muon's
warmup_iters = 10
warmdown_frac = 0.65          # a linear warmdown over the last 65% of the steps (authors' --warmdown-ratio) ...
final_lr_frac = 0.05          # ... to 5% of each peak rate
# evaluation, logging, checkpoints
eval_interval = 40            # steps between validations and checkpoints; the last step always evaluates
eval_tokens = 65536           # the validation slice: the first eval_tokens of val
log_interval = 5
core_eval = False             # at the end, eval.py's CORE benchmark of the final checkpoint
eval_bundle = ""              # eval.py's --bundle (default: its own)
# system
seed = 1337
device = "auto"               # auto (cuda if there is one, else cpu) | cpu | cuda | cuda:1 | ...
dtype = "bfloat16"            # autocast dtype on CUDA: bfloat16 | float32
compile = True                # torch.compile the training model on CUDA
resume = False                # continue the run in out_dir from its checkpoint
dry_run = False               # print the settings and the plan, then stop
SETTINGS = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (bool, int, float, str))]
MODEL_KEYS = [f.name for f in fields(GPTConfig)]
BUDGETS = ("target_flops", "target_tokens", "max_iters")
# may differ on --resume: they only place the run, log or evaluate (device_batch_size reorders a sum)
FREE = ("out_dir", "resume", "dry_run", "device", "dtype", "compile", "device_batch_size", "eval_interval",
        "eval_tokens", "log_interval", "core_eval", "eval_bundle")
EPOCH_ADVICE = ("the paper's regime is a single epoch, and BoV's tables memorise repeated data (gamma_v grows); "
                "lower the budget or prepare more data")
# dense bf16 FLOP/s per GPU for MFU; the first name in torch.cuda.get_device_name() wins (PCIe, NVL before SXM)
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12, "H100": 989e12, "H200": 989e12,
              "A100": 312e12}


def settings(argv):
    """The defaults above, then config files and --key=value in order -> {setting: value}, with the GPTConfig
    fields given. A value takes its default's type (an int may be written 2e9, a float 3)."""
    s = {k: globals()[k] for k in SETTINGS}
    for arg in argv:
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            try:
                given = {key: ast.literal_eval(text) if eq else True}
            except (ValueError, SyntaxError):
                given = {key: text}
        else:
            given = {}
            exec(open(arg).read(), {}, given)
        for key, value in given.items():
            if key not in SETTINGS + MODEL_KEYS:
                sys.exit(f"unknown setting {key!r} in {arg}; the settings are {', '.join(SETTINGS)} and the "
                         f"GPTConfig fields {', '.join(MODEL_KEYS)}")
            if key in SETTINGS:
                like = globals()[key]
                if type(like) in (int, float) and type(value) in (int, float) and value == type(like)(value):
                    value = type(like)(value)
                assert type(value) is type(like), f"{key}={value!r}: expected {type(like).__name__}"
            if key in BUDGETS:
                s.update({b: type(s[b])(0) for b in BUDGETS})
            s[key] = value
    s["out_dir"] = s["out_dir"] or os.path.join("out", f"{s['size']}_{s['variant']}")
    return s


def plan(s, flops_per_token, block_size, world=1):
    """-> (iterations, gradient-accumulation steps). Table 6 fixes the FLOPs: iterations = target_flops /
    (FLOPs per token x tokens per step), rounded; or target_tokens / tokens per step; or max_iters."""
    assert sum(bool(s[b]) for b in BUDGETS) == 1, f"give one budget: {', '.join(BUDGETS)}"
    tokens = s["target_tokens"] or s["target_flops"] / flops_per_token
    iters = s["max_iters"] or max(1, round(tokens / s["total_batch_tokens"]))
    rows = s["device_batch_size"] * block_size * world
    assert s["total_batch_tokens"] % rows == 0, f"total_batch_tokens: not a multiple of {rows}"
    return iters, s["total_batch_tokens"] // rows


def lr_multiplier(step, iters, warmup, warmdown_frac, final_frac):
    """The schedule (Table 6) of 0-based `step`: linear warmup to the peak, constant, then a linear warmdown over
    the last round(warmdown_frac x iters) steps, reaching final_frac at step == iters."""
    if step < warmup:
        return (step + 1) / warmup
    warmdown = round(warmdown_frac * iters)
    if step < iters - warmdown:
        return 1.0
    return final_frac + (1 - final_frac) * (iters - step) / max(warmdown, 1)

# -----------------------------------------------------------------------------
# Data


class Loader:
    """Training rows of T + 1 tokens (inputs, then targets shifted by one), the same on every rank. Each epoch
    shuffles the documents (each starts at <|bos|>, none crosses a shard) with (seed, epoch), cuts one longer than
    a row into rows at stride T, and packs what is left best-fit into rows: a whole document anywhere, the tail of
    a cut one only at a row's start (its first token was the last target before it); the room left is padding,
    target -1. So every token but <|bos|> is one row's target once per epoch. The state is (epoch, row)."""

    OPEN_ROWS = 256  # rows kept open for best fit

    def __init__(self, shards, bos_id, T, seed):
        self.shards, self.T, self.seed = shards, T, seed
        self.offsets = np.cumsum([0] + [len(sh) for sh in shards])  # each shard's first global position
        docs = []
        for sh, off in zip(shards, self.offsets):
            starts = np.union1d([0], np.flatnonzero(np.asarray(sh) == bos_id))
            docs.append(np.stack([starts, np.append(starts[1:], len(sh))], axis=1) + off)
        self.docs = np.concatenate(docs)  # (documents, 2): global start, end
        self.load_state({"epoch": 0, "row": 0})

    def load_state(self, state):
        self.epoch, self.row = state["epoch"], state["row"]
        self.ptr, self.segs = self.pack(self.epoch)

    def pack(self, epoch):
        """-> (ptr, segs): row r of the epoch is segs[ptr[r]:ptr[r + 1]], each (global start, length)."""
        rng = np.random.default_rng([self.seed, epoch])
        T, R = self.T, self.T + 1
        rows, pieces = [], []
        for s, e in self.docs[rng.permutation(len(self.docs))].tolist():
            whole = e - s <= R
            while e - s > R:  # full rows of a long document
                rows.append([(s, R)])
                s += T
            if e - s >= 2:  # a piece needs an input and a target
                pieces.append((s, e - s, whole))
        open_rows, room = [], []  # sorted by their room
        for s, n, whole in pieces:
            i = bisect.bisect_left(room, n)  # the open row with the least room that still fits
            if whole and i < len(room):
                row, left = open_rows.pop(i), room.pop(i) - n
                row.append((s, n))
            else:
                row, left = [(s, n)], R - n
                if len(open_rows) == self.OPEN_ROWS:  # close the fullest
                    rows.append(open_rows.pop(0))
                    room.pop(0)
            j = bisect.bisect_left(room, left)
            open_rows.insert(j, row)
            room.insert(j, left)
        rows += open_rows
        rows = [rows[i] for i in rng.permutation(len(rows))]
        return np.cumsum([0] + [len(r) for r in rows]), np.array([g for r in rows for g in r]).reshape(-1, 2)

    def next_rows(self, n):
        """The next n rows, (n, T + 1) int64, -1 where padded; past the last row of an epoch, the next epoch's."""
        out = np.full((n, self.T + 1), -1, dtype=np.int64)
        for i in range(n):
            if self.row == len(self.ptr) - 1:
                self.load_state({"epoch": self.epoch + 1, "row": 0})
            pos = 0
            for start, length in self.segs[self.ptr[self.row]:self.ptr[self.row + 1]]:
                k = np.searchsorted(self.offsets, start, side="right") - 1
                out[i, pos:pos + length] = self.shards[k][start - self.offsets[k]:][:length]
                pos += length
            self.row += 1
        return out


def val_rows(shards, T, n_tokens):
    """The fixed validation slice: the first n_tokens of val, cut into rows of T + 1 at stride T."""
    data = np.concatenate(shards)
    n = min(n_tokens // T, (len(data) - 1) // T)
    assert n >= 1, f"the validation split has {len(data)} tokens, less than a row"
    return np.lib.stride_tricks.sliding_window_view(data[:n * T + 1], T + 1)[::T].astype(np.int64)


@torch.no_grad()
def evaluate(model, rows, token_bytes, batch_size, autocast=nullcontext(), rank=0, world=1):
    """Val loss (nats per target) and bits per byte: the nats of the text targets / ln 2 / their UTF-8 bytes
    (token_bytes[id]; <|bos|> has 0, so its targets count in neither). Rank r scores batches r, r + world, ..."""
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=token_bytes.device)  # nats, targets, text nats, text bytes
    for i in range(rank * batch_size, len(rows), world * batch_size):
        batch = torch.from_numpy(rows[i:i + batch_size]).to(token_bytes.device)
        x, y = batch[:, :-1], batch[:, 1:].flatten()
        with autocast:
            logits, _ = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y, reduction="none").double()
        nbytes = token_bytes[y]
        sums += torch.stack([loss.sum(), loss.new_tensor(len(y)), (loss * (nbytes > 0)).sum(), nbytes.sum()])
    if world > 1:
        dist.all_reduce(sums)
    model.train()
    nats, count, text_nats, text_bytes = sums.tolist()
    return {"val_loss": nats / count, "val_bpb": text_nats / math.log(2) / text_bytes}

# -----------------------------------------------------------------------------
# The run


def rng_state():
    """Python's, numpy's and torch's RNG states, in types that torch.load(weights_only=True) reads."""
    kind, keys, *rest = np.random.get_state()
    return {"python": random.getstate(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), *rest],
            "torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all()}


def set_rng_state(state):
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    torch.cuda.set_rng_state_all(state["cuda"][:torch.cuda.device_count()])


def pick_device(setting, local_rank=0):
    """--device -> torch.device; auto: CUDA if there is a GPU, else the CPU. CUDA is the local rank's GPU."""
    dev = setting if setting != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", local_rank) if dev == "cuda" else torch.device(dev)


def main(argv):
    """Train as argv says; -> the last evaluation's record (None for --help and --dry_run)."""
    s = settings([a for a in argv if a not in ("-h", "--help")])
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip() + "\n\nsettings:\n" + "\n".join(f"  {k} = {v!r}" for k, v in s.items()))
        return None
    ddp = "RANK" in os.environ  # started by torchrun
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    log = print if rank == 0 else (lambda *a: None)

    # the model's shapes and the data's vocabulary -> the plan, all that a dry run does
    meta_path = os.path.join(s["data_dir"], "meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else None
    if meta is None and not s["dry_run"]:
        sys.exit(f"no prepared data in {s['data_dir']} (no meta.json); run `python prepare_data.py` first")
    overrides = {k: s[k] for k in MODEL_KEYS if k in s}
    if meta:
        vocab = overrides.setdefault("vocab_size", meta["vocab_size"])
        assert vocab >= meta["vocab_size"], f"vocab_size {vocab} is below the data's, {meta['vocab_size']}"
        if vocab > np.iinfo(meta["dtype"]).max + 1:
            sys.exit(f"vocab_size {vocab} is more than the data's {meta['dtype']} token ids can hold")
    config = GPTConfig.preset(s["size"], s["variant"], **overrides)
    shapes = GPT(config, device="meta")
    flops_per_token, counts = shapes.estimate_flops(), shapes.num_params()
    iters, accum = plan(s, flops_per_token, config.block_size, world)
    tbt, tokens = s["total_batch_tokens"], iters * s["total_batch_tokens"]
    log(f"settings: {json.dumps(s)}")
    log(f"model: {s['size']} / {s['variant']}, {counts['dense']:,} dense + {counts['tables']:,} table parameters, "
        f"target layers {list(config.target_layers())}, {flops_per_token:,} FLOPs/token")
    log(f"plan: {iters:,} iterations of {tbt:,} tokens = {s['device_batch_size']} x {config.block_size} x {accum} "
        f"accumulation x {world} ranks: {tokens:,} tokens, {flops_per_token * tokens:.3g} FLOPs, tokens:params "
        f"{tokens / counts['scaling']:.3g}")
    if meta and tokens > meta["train_tokens"]:
        log(f"WARNING: {tokens / meta['train_tokens']:.2f} epochs of {s['data_dir']}: {EPOCH_ADVICE}")
    if s["dry_run"]:
        return None

    # a fresh out_dir, or the checkpoint of the same settings
    ckpt_path = os.path.join(s["out_dir"], "ckpt.pt")
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True) if s["resume"] else None
    if ckpt:
        was = ckpt["config"]
        key = next((k for k in {**was, **s} if k not in FREE and s.get(k) != was.get(k)), None)
        if key:
            sys.exit(f"--resume: {ckpt_path} was trained with {key}={was.get(key)!r}, this run has {s.get(key)!r}")
    elif os.path.exists(ckpt_path):
        sys.exit(f"{ckpt_path} exists: pass --resume to continue that run, or choose another --out_dir")

    # device and ranks
    dev = pick_device(s["device"], local_rank)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
        torch.set_float32_matmul_precision("high")  # TF32
    if ddp:
        dist.init_process_group("nccl" if cuda else "gloo")
    assert s["dtype"] in ("bfloat16", "float32"), f"dtype={s['dtype']!r}: bfloat16 or float32"
    bf16 = cuda and s["dtype"] == "bfloat16"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else nullcontext()

    # data
    read = lambda f: np.memmap(os.path.join(s["data_dir"], f), dtype=meta["dtype"], mode="r")
    loader = Loader([read(f) for f in meta["train_files"]], meta["bos_id"], config.block_size, s["seed"])
    val = val_rows([read(f) for f in meta["val_files"]], config.block_size, s["eval_tokens"])
    token_bytes = torch.from_numpy(np.load(os.path.join(s["data_dir"], "token_bytes.npy"))).to(dev)
    tokenizer = json.load(open(os.path.join(s["data_dir"], "tokenizer.json")))
    log(f"data: {len(loader.ptr) - 1:,} rows of {config.block_size + 1} tokens per epoch, {len(val)} val rows")

    # model and optimizers, then the checkpoint's state
    torch.manual_seed(s["seed"])
    random.seed(s["seed"])
    np.random.seed(s["seed"])
    model = GPT(config, device=dev)
    optimizers = model.configure_optimizers(s["matrix_lr"], s["embedding_lr"], s["unembedding_lr"], s["scalar_lr"],
                                            s["table_lr"], s["weight_decay"])
    step, smooth, metrics = 0, 0.0, [{"type": "config", **s}]
    if ckpt:
        model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, ckpt["optimizers"], strict=True):
            opt.load_state_dict(state)
        loader.load_state(ckpt["loader"])
        set_rng_state(ckpt["rng"])
        step, smooth, metrics = ckpt["step"], ckpt["smooth_loss"], ckpt["metrics"]
        log(f"resumed {ckpt_path} at step {step}")
    del ckpt  # held by the model and optimizers now
    compiled = cuda and s["compile"]
    train_model = torch.compile(model) if compiled else model
    if ddp:
        train_model = DistributedDataParallel(train_model, device_ids=[dev.index] if cuda else None)
    peak = next((v for k, v in PEAK_FLOPS.items() if k in torch.cuda.get_device_name(dev)), None) if bf16 else None
    log(f"device: {dev} x {world}, {'bf16 autocast' if bf16 else 'float32'}{', compiled' if compiled else ''}")

    def check(loss, what, step):
        """Stop at a NaN or inf loss, before it reaches a checkpoint."""
        if not math.isfinite(loss):
            kept = f"last good checkpoint: {ckpt_path}" if os.path.exists(ckpt_path) else "no checkpoint written"
            sys.exit(f"the {what} is {loss} at step {step}; stopping ({kept})")

    def evaluate_and_save(step):
        """Evaluate and log; after step 0, rank 0 saves the checkpoint (atomically), then metrics.jsonl."""
        r = evaluate(model, val, token_bytes, s["device_batch_size"], autocast, rank, world)
        check(r["val_loss"], "val loss", step)
        coeffs = {str(k): v for k, v in model.coefficients().items()}  # the learned gamma_v (Fig 2)
        metrics.append({"type": "eval", "step": step, "tokens": step * tbt, "flops": step * tbt * flops_per_token,
                        **r, "coefficients": coeffs})
        log(f"eval step {step}: val loss {r['val_loss']:.4f}, val bpb {r['val_bpb']:.4f}"
            + "".join(f" | L{k} " + " ".join(f"{n} {x:.3f}" for n, x in c.items()) for k, c in coeffs.items()))
        if rank == 0 and step > 0:
            os.makedirs(s["out_dir"], exist_ok=True)
            torch.save({"model": model.state_dict(), "model_config": asdict(config), "tokenizer": tokenizer,
                        "config": s, "step": step, "optimizers": [o.state_dict() for o in optimizers],
                        "loader": {"epoch": loader.epoch, "row": loader.row}, "rng": rng_state(),
                        "metrics": metrics, "smooth_loss": smooth}, ckpt_path + ".tmp")
            os.replace(ckpt_path + ".tmp", ckpt_path)
            with open(os.path.join(s["out_dir"], "metrics.jsonl"), "w") as f:
                f.writelines(json.dumps(m) + "\n" for m in metrics)

    # the loop
    start, B, bos = step, s["device_batch_size"], meta["bos_id"]
    t_start = t_last = time.time()
    while True:
        if (step % s["eval_interval"] == 0 or step == iters) and not (s["resume"] and step == start):  # saved
            evaluate_and_save(step)
            t_last = time.time()  # step times leave out evaluation
        if step == iters:
            break
        lrm = lr_multiplier(step, iters, s["warmup_iters"], s["warmdown_frac"], s["final_lr_frac"])
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = g["initial_lr"] * lrm  # Muon's decay is lr x weight_decay: it follows too
        epoch = loader.epoch
        rows = loader.next_rows(B * accum * world)  # the whole step, on every rank
        if loader.epoch != epoch:
            log(f"WARNING: step {step + 1} starts epoch {loader.epoch + 1} of {s['data_dir']}: {EPOCH_ADVICE}")
        # the step's loss is the mean over all its targets: micro-batches with padding hold fewer, so each adds
        # its sum / the step's count (x world: DDP averages the ranks' gradients)
        n_targets = int((rows[:, 1:] >= 0).sum())
        loss_sum = torch.zeros((), device=dev)
        for micro in range(accum):
            lo = (micro * world + rank) * B
            batch = torch.from_numpy(rows[lo:lo + B]).to(dev)
            x, y = torch.where(batch[:, :-1] < 0, bos, batch[:, :-1]), batch[:, 1:]  # padding reads <|bos|>
            if ddp:
                train_model.require_backward_grad_sync = micro == accum - 1  # sync after the last micro-batch
            with autocast:
                logits, _ = train_model(x)
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum")
            (loss * (world / n_targets)).backward()
            loss_sum += loss.detach()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        if ddp:
            dist.all_reduce(loss_sum)
        loss = loss_sum.item() / n_targets
        check(loss, "loss", step + 1)
        step += 1
        smooth = 0.9 * smooth + 0.1 * loss  # logged debiased, as nanochat
        now = time.time()
        dt, t_last = now - t_last, now
        if step % s["log_interval"] == 0 or step == iters:
            tok_s = tbt / dt
            mfu = f" | mfu {100 * flops_per_token * tok_s / (peak * world):.1f}%" if peak else ""
            eta = (now - t_start) / (step - start) * (iters - step)
            log(f"step {step}/{iters} | loss {smooth / (1 - 0.9 ** step):.4f} | lrm {lrm:.2f} | "
                f"dt {dt * 1000:.0f} ms | tok/s {tok_s:,.0f}{mfu} | eta {eta / 60:.1f}m")
            metrics.append({"type": "train", "step": step, "tokens": step * tbt, "loss": loss, "lrm": lrm})

    if ddp:  # leave together: a rank that tears its process group down first can hang another's teardown
        dist.barrier()
        dist.destroy_process_group()
    log(f"done: {step} steps, val bpb {metrics[-1]['val_bpb']:.4f}, {(time.time() - t_start) / 60:.1f} min")
    if rank == 0 and s["core_eval"]:
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "eval.py"), "--ckpt", s["out_dir"]]
                       + (["--bundle", s["eval_bundle"]] if s["eval_bundle"] else []), check=True)
    return metrics[-1]


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # `python train.py | tee log` shows each line as it comes
    if sys.platform == "linux" and not torch.cuda.is_available():  # glibc: keep the memory a CPU step frees for
        ctypes.CDLL(None).mallopt(-4, 0), ctypes.CDLL(None).mallopt(-1, -1)  # the next (~20% faster steps)
    main(sys.argv[1:])
