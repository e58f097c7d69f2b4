"""
Train a GPT, standard or Bank of Values, on a FLOP budget as the paper does (its Table 6).

    python train.py                                       # size "cpu", BoV, offline Shakespeare, a few minutes on 2 cores
    python train.py --variant=baseline                    # the same budget in FLOPs for standard attention
    python train.py config/paper_135m.py --variant=baseline --dry_run   # print the plan only
    python train.py config/paper_135m.py --variant=bov    # a config file, then --key=value overrides
    torchrun --standalone --nproc_per_node=8 train.py config/paper_135m.py

Settings resolve in this order: the defaults below, the size's recipe (SIZE_DEFAULTS), then config
files (Python assignments) and --key=value in the order given, a later one winning (a budget on the
command line wins over a config file's wherever it stands). Any GPTConfig
field (n_layer, bov_layers, ...) is a key too. The resolved settings are printed and saved in the checkpoint.

Where the recipe lives: the defaults and SIZE_DEFAULTS below; plan_iterations (budget -> steps) and
lr_multiplier (the schedule); model.py's GPT.configure_optimizers (the Muon / AdamW split, betas, width
scaling); Batches (the data); evaluate (val loss and bpb, on val_rows); run(), from "# the loop" (the step,
the log line, metrics.jsonl). The rest refuses a bad run in one line (settings, resume checks, locks,
signals, torchrun) and can be skipped on a first read.
"""

import bisect
import difflib
import glob
import json
import math
import os
import random
import signal
import sys
import time
import types
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, fields

# Ctrl-C or SIGTERM while torch loads (a second or more): one line and exit 130 or 143, not a traceback or a silent
# kill, as once loaded (a signal ignored at the start stays ignored: `cmd &` ignores SIGINT)
if __name__ == "__main__":
    def _stopped_while_loading(sig, _):
        try:
            os.write(2, b"train.py: terminated (SIGTERM)\n" if sig == signal.SIGTERM else b"train.py: interrupted\n")
        finally:  # the exit code even with stderr closed (`2>&-`)
            os._exit(128 + sig)
    for _sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(_sig) is not signal.SIG_IGN:
            signal.signal(_sig, _stopped_while_loading)

import numpy as np
import torch
import torch.distributed as dist

from model import (GPT, GPTConfig, SIZES, VARIANTS, compile_failed, first_line, out_of_memory, unreadable_checkpoint,
                   widest_float)
from prepare_data import (DEFAULT_DATA_DIR, DataError, atomic_write, being_written, handle_signals, load_meta, load_token_bytes,
                          load_tokenizer, load_tokens, lock_folder, missing_top, out_dir_problem, prepare_command,
                          reconfigure_stdout, remove_unused, silence_stdout, tokenizer_sha256, whole_number, write_json)
from sample import UNKNOWN_DEVICE, autocast as sample_autocast, bf16_in_hardware, check_device, keep_freed_memory

# -----------------------------------------------------------------------------
# Defaults. Learning rates are the peak rates of the paper's 135M run (Table 6; table_lr from Section 5); configure_optimizers
# scales the AdamW ones of embedding, lm_head and tables by (n_embd/768)^-0.5 as nanochat does. A run takes these,
# then SIZE_DEFAULTS[size]: the default size "cpu" replaces the budget, batch, warmup, eval and log settings below.
size = "cpu"
variant = "bov"
data_dir = DEFAULT_DATA_DIR
out_dir = ""                 # default: out/<size>_<variant>
# budget: exactly one of these decides the number of iterations
target_flops = 0.0           # FLOPs = estimate_flops() x tokens, the paper's compute control
target_tokens = 0
max_iters = 0
total_batch_tokens = 524288  # tokens per optimizer step, over all ranks and accumulation steps
device_batch_size = 16       # sequences per forward pass on one device
# optimisation
matrix_lr = 0.02             # Muon: every 2-D matrix in the blocks (torch scales it by sqrt(max(1, rows/cols)))
embedding_lr = 0.30          # AdamW
unembedding_lr = 0.008
scalar_lr = 0.50             # gamma_v, or alpha_v and beta_v of the add variants
table_lr = 0.15              # every value table: BoV's E_v, and value_embed_gated's embeddings
weight_decay = 0.28          # Muon only
warmup_iters = 40
warmdown_frac = 0.65         # linear warmdown over the last 65%: the authors' --warmdown-ratio 0.65 (Table 6's "from 0.65" also reads as the last 35%) ...
final_lr_frac = 0.05         # ... towards 5% of the peak, reached at step == iters (the last update has a little more)
# evaluation, logging, checkpoints
eval_interval = 250          # steps between validations (and checkpoints); the last step always evaluates
eval_tokens = 10 * 524288    # size of the fixed validation slice (the paper's 41.9M: --eval_tokens=41.9e6)
log_interval = 1
core_eval = False            # run eval.py's CORE benchmark on the final model
eval_bundle = ""             # the DCLM eval bundle for core_eval (default: eval.py's cache / download)
# system
seed = 1337
device = "auto"              # auto | cpu | cuda | cuda:1 | mps
dtype = "auto"               # auto (bf16 autocast on an Ampere or later GPU, fp32 elsewhere) | float32 | bfloat16
compile = "auto"             # torch.compile the training model (auto: on CUDA)
resume = False               # continue the run in out_dir from its checkpoint
dry_run = False              # print the plan and exit (no model allocated; of the data, only meta.json: vocabulary, epochs)

# Each size's recipe. paper_780m: the 135M rates x sqrt(2) for the doubled batch (nanochat's rule); with the
# (1536/768)^-0.5 width scaling of the AdamW rates this gives Table 6's 0.0283 / 0.30 / 0.008 / 0.707, and
# table_lr 0.15 (Section 5's rate, which the paper gives once for both sizes).
SIZE_DEFAULTS = {
    "paper_135m": dict(target_flops=1.5e18, total_batch_tokens=2**19, device_batch_size=16, weight_decay=0.28),
    "paper_780m": dict(target_flops=3.91e19, total_batch_tokens=2**20, device_batch_size=4, weight_decay=0.0597,
                       matrix_lr=0.02 * 2**0.5, scalar_lr=0.5 * 2**0.5, embedding_lr=0.30 * 2**0.5,
                       unembedding_lr=0.008 * 2**0.5, table_lr=0.15 * 2**0.5),
    # ~0.5M tokens (about a third of an epoch of Shakespeare) in ~5 minutes on 2 CPU cores
    "cpu": dict(target_flops=1.15e13, total_batch_tokens=4096, device_batch_size=16, warmup_iters=10,
                eval_interval=40, eval_tokens=65536, log_interval=5),
}
TRAIN_KEYS = [k for k, v in globals().items() if k.islower() and not k.startswith("_") and isinstance(v, (int, float, bool, str))]
MODEL_KEYS = [f.name for f in fields(GPTConfig)]
LOSS_EMA = 0.9  # the logged training loss is a moving average of the steps' losses, debiased, as nanochat logs it
# dense bf16 per GPU, the first name found in torch.cuda.get_device_name() wins: the PCIe and NVL parts before the SXM ones
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def peak_flops(gpu):
    """Dense bf16 FLOP/s of the GPU torch.cuda.get_device_name() calls `gpu`, for MFU; None if not listed."""
    return next((v for k, v in PEAK_FLOPS.items() if k in gpu), None)


def mfu(flops_per_token, tok_s, peak, world):
    """Model FLOPs utilisation, %: the FLOP/s the run's tok_s (all ranks together) takes, over the world's GPUs' peak."""
    return 100 * flops_per_token * tok_s / (peak * world)


EPOCH_ADVICE = ("the paper's regime is a single epoch and BoV's tables memorise repeated data (gamma_v grows). "
                "Lower the budget or prepare more data.")
# What main() cleans up and stopped_note() reports, whenever run() stops: "ckpt" and "eval_interval" (for the
# Ctrl-C line; set by run() and plan()), "dry_run" (set by run(): a dry run writes nothing, stopped_note() says),
# "out_lock" / "data_lock" (the folder locks that claim_out_dir() and lock_data() hold), "made" (the out_dir this
# run created), "signal" (the stop signal that arrived, from stop_signal()), "rank" and "alike" (under torchrun,
# rank 0 alone prints a stop line, or an error that every rank meets alike: on one machine, any but one GPU's; on
# several, a loss that is no longer finite).
RUN = {"ckpt": None}


class ConfigError(Exception):
    """A one-line reason to stop: the settings, the data or the checkpoint, or, mid-run, a full disk or a
    loss that is no longer finite."""


# -----------------------------------------------------------------------------
# settings

def _parse_value(key, text, like):
    if key == "bov_layers":  # a name or "4,5": GPTConfig reads both, and says what else it takes
        return text
    if isinstance(like, bool):
        if text.lower() in ("1", "true", "yes", "on"):  # a bare --flag arrives here as "true"; --flag= is refused
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true/false, got {text!r}")
    if isinstance(like, int):
        return whole_number(text)
    if isinstance(like, float):
        return float(text)
    return text


CONFIG_FILE_LIMIT = 2**20  # characters: the paper's config files are a few hundred


def _check_type(key, value, like, where):
    """A config file's value against the default's type (ints may be written 1e6)."""
    if isinstance(like, bool):
        ok = isinstance(value, bool)
    elif isinstance(like, int):
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
        value = int(value) if ok else value
    elif isinstance(like, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and isinstance(value, int) and abs(value) > sys.float_info.max:  # 10**400: float() would overflow
            raise ConfigError(f"{key} in {where} is an integer too large for a float (past 1.8e308)")
        value = float(value) if ok else value
    elif isinstance(like, str) and key not in ("bov_layers", "compile"):  # compile: "auto" or a bool
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        # no default quoted: a size's recipe (SIZE_DEFAULTS) or preset (model.SIZES) may set another than `like`
        raise ConfigError(f"{key} = {value!r} in {where}: expected {type(like).__name__}")
    return value


# nanoGPT's names for settings that are spelled differently here (a user's first guesses)
NANOGPT_NAMES = {
    "batch_size": "device_batch_size (sequences per forward pass; total_batch_tokens sets the step)",
    "gradient_accumulation_steps": "total_batch_tokens (the accumulation follows from it)",
    "learning_rate": "matrix_lr (Muon), with embedding_lr, unembedding_lr, scalar_lr and table_lr (AdamW)",
    "min_lr": "final_lr_frac (a fraction of each peak rate)",
    "lr_decay_iters": "warmdown_frac (the schedule follows the budget)",
    "init_from": "--resume here for init_from='resume' (it continues the run in out_dir); 'scratch' is the default, "
                 "and OpenAI's GPT-2 weights ('gpt2*') do not fit this model",
    "eval_iters": "eval_tokens (a fixed validation slice)",
    "wandb_log": "not here: every evaluation goes to out_dir/metrics.jsonl, which `bench.py --plot` draws",
    "grad_clip": "not here: no clipping, as in nanochat (add torch.nn.utils.clip_grad_norm_ before opt.step() in run())",
    "decay_lr": "warmdown_frac (--warmdown_frac=0 keeps the peak rate to the end)",
    "beta1": "fixed in model.py's configure_optimizers (AdamW betas 0.8, 0.95; Muon momentum 0.95)",
    "beta2": "fixed in model.py's configure_optimizers (AdamW betas 0.8, 0.95; Muon momentum 0.95)",
    "dropout": "not in this model (nanochat has none either)",
    "bias": "not in this model (no biases, as nanochat)",
}


def unknown_setting(keys, where=None):
    """The one-line error for settings train.py does not have (as --key, or in the config file `where`):
    nanoGPT's name for the first, or the nearest names."""
    dash = "" if where else "--"
    key = keys[0]
    if key in NANOGPT_NAMES:
        hint = f"nanoGPT's {key} is {NANOGPT_NAMES[key]}"
    else:
        near = difflib.get_close_matches(key, TRAIN_KEYS + MODEL_KEYS, n=3, cutoff=0.7)
        hint = (f"did you mean {' or '.join(dash + k for k in near)}?" if near
                else f"settings are: {', '.join(TRAIN_KEYS + MODEL_KEYS)}")
    place = f" in config file {where}" if where else ""
    return ConfigError(f"unknown setting{'s' * (len(keys) > 1)} {', '.join(dash + k for k in keys)}{place}; {hint}")


def resolve_settings(argv):
    """Defaults, then the size's recipe, then config files and --key=value in the order given (a later one
    winning, but a budget on the command line wins over a config file's wherever it stands).
    Returns (train dict, model overrides)."""
    defaults = {k: globals()[k] for k in TRAIN_KEYS}
    model_defaults = {f.name: f.default for f in fields(GPTConfig)}
    given, budgets = {}, ("target_flops", "target_tokens", "max_iters")
    cli_budgets = {a[2:].partition("=")[0] for a in argv if a.startswith("--")} & set(budgets)
    for arg in argv:
        if not arg.startswith("--"):
            if not os.path.exists(arg) or os.path.isdir(arg):  # a file, or a pipe (/dev/stdin, <(...))
                if os.path.isdir(arg):
                    raise ConfigError(f"config file {arg} is a folder")
                hint = f"; did you mean --{arg.lstrip('-')}?" if "=" in arg and os.sep not in arg else ""  # nanoGPT's form, or -key
                raise ConfigError(f"config file {arg} not found{hint}")
            scope = {}
            try:
                with open(arg) as f:
                    code = f.read(CONFIG_FILE_LIMIT + 1)  # bounded: `python train.py /dev/zero` would fill the memory
                if len(code) > CONFIG_FILE_LIMIT:
                    raise ConfigError(f"config file {arg} is over {CONFIG_FILE_LIMIT // 2**20}M characters: not a config file")
                exec(code, {}, scope)
            except ConfigError:
                raise
            except Exception as e:
                raise ConfigError(f"config file {arg}: {type(e).__name__}: {e}")
            scope = {k: v for k, v in scope.items() if not isinstance(v, types.ModuleType)}  # `import math` sets nothing
            unknown = [k for k in scope if not k.startswith("_") and k not in defaults and k not in model_defaults]
            if unknown:
                raise unknown_setting(unknown, arg)
            if not cli_budgets and set(scope) & set(budgets):  # this file's budget replaces an earlier file's
                for k in budgets:
                    given.pop(k, None)
            for k, v in scope.items():
                if not k.startswith("_") and not (cli_budgets and k in budgets):  # --key=value's budget wins
                    given[k] = _check_type(k, v, defaults.get(k, model_defaults.get(k)), f"config file {arg}")
            continue
        key, _, text = arg[2:].partition("=")
        if key not in defaults and key not in model_defaults:
            raise unknown_setting([key])
        like = defaults.get(key, model_defaults.get(key))
        if "=" not in arg and not isinstance(like, bool) and key != "compile":
            raise ConfigError(f"--{key} needs a value: --{key}=VALUE (only true/false settings may stand alone)")
        try:
            given[key] = _parse_value(key, text if "=" in arg else "true", like)
        except (ValueError, OverflowError) as e:
            raise ConfigError(f"--{key}: {e}")
    size = given.get("size", defaults["size"])
    if size not in SIZES:
        raise ConfigError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    if size not in SIZE_DEFAULTS:  # a size added to model.SIZES alone
        raise ConfigError(f"size {size!r} has no recipe here; add its budget and batch to SIZE_DEFAULTS in train.py")
    s = {**defaults, **SIZE_DEFAULTS[size]}
    for key in budgets:
        if key in given and not given[key] > 0:  # 0 would silently fall back to the size's budget
            raise ConfigError(f"--{key} must be positive, got {given[key]}")
    budget_keys = [k for k in budgets if k in given]
    if len(budget_keys) > 1:
        raise ConfigError(f"give one budget, not {' and '.join(budget_keys)}")
    if budget_keys:  # an explicit budget replaces the size's
        s.update(target_flops=0.0, target_tokens=0, max_iters=0)
    s.update({k: v for k, v in given.items() if k in defaults})
    if not (s["target_flops"] or s["target_tokens"] or s["max_iters"]):
        raise ConfigError("no budget: give --target_flops, --target_tokens or --max_iters")
    if s["variant"] not in VARIANTS:
        raise ConfigError(f"unknown variant {s['variant']!r}; choose one of {', '.join(VARIANTS)}")
    for key in ("total_batch_tokens", "device_batch_size", "eval_interval", "eval_tokens", "log_interval"):
        if s[key] <= 0:
            raise ConfigError(f"--{key} must be positive, got {s[key]}")
    for key in TRAIN_KEYS:
        if isinstance(s[key], float) and not math.isfinite(s[key]):
            raise ConfigError(f"--{key} must be a finite number, got {s[key]}")
    for key in ("target_flops", "target_tokens", "max_iters", "warmup_iters", "seed", "matrix_lr", "embedding_lr",
                "unembedding_lr", "scalar_lr", "table_lr", "weight_decay"):
        if s[key] < 0:
            raise ConfigError(f"--{key} must not be negative, got {s[key]}")
    if s["seed"] >= 2 ** 32:
        raise ConfigError(f"--seed must be below 2^32 (numpy's limit), got {s['seed']}")
    for key in ("warmdown_frac", "final_lr_frac"):
        if not 0 <= s[key] <= 1:
            raise ConfigError(f"--{key} is a fraction: 0 to 1, got {s[key]}")
    if s["eval_bundle"] and not s["core_eval"]:
        raise ConfigError("--eval_bundle is read by --core_eval only")
    if not s["data_dir"]:
        raise ConfigError(f"--data_dir is empty; give the prepared-data folder (default {DEFAULT_DATA_DIR})")
    choices = {"dtype": ("auto", "float32", "bfloat16"), "compile": ("auto", "true", "false")}
    s["compile"] = {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(
        str(s["compile"]).lower(), str(s["compile"]).lower())
    for key, allowed in choices.items():
        if s[key] not in allowed:
            raise ConfigError(f"--{key} must be one of {', '.join(allowed)}, got {s[key]!r}")
    s["out_dir"] = s["out_dir"] or os.path.join("out", f"{s['size']}_{s['variant']}")
    return s, {k: v for k, v in given.items() if k in model_defaults}


def lr_multiplier(step, total, warmup, warmdown_frac, final_frac):
    """Linear warmup, constant, then linear warmdown over the last warmdown_frac to final_frac (Table 6)."""
    if step < warmup:
        return (step + 1) / warmup
    warmdown = round(warmdown_frac * total)  # Python's round: a half goes to the even neighbour (3.5 -> 4, 6.5 -> 6)
    if step < total - warmdown:
        return 1.0
    progress = (total - step) / max(warmdown, 1)  # 1 -> 0 over the warmdown
    return final_frac + (1 - final_frac) * progress


def plan_iterations(s, flops_per_token):
    """Iterations from the budget: max_iters as given, else (target_tokens, or target_flops / FLOPs per
    token) / tokens per step, rounded, at least 1."""
    if s["max_iters"]:
        return s["max_iters"]
    tokens = s["target_tokens"] or s["target_flops"] / flops_per_token
    return max(1, round(tokens / s["total_batch_tokens"]))


# -----------------------------------------------------------------------------
# data

class Batches:
    """Deterministic, resumable training rows of T + 1 tokens (inputs and shifted targets).

    Every epoch:
      - the documents (each starts at <|bos|>) are shuffled with the seed and the epoch;
      - a document longer than a row is cut into full rows at stride T;
      - what is left of each document is packed best-fit into rows: a whole document anywhere, the tail
        of a cut one only at the start of a row of its own (its first token was the last target of the
        document's previous row); room a row cannot fill is padding, with target -1.
    So every token but <|bos|> is the target of exactly one row per epoch (a <|bos|> at most once: not
    where it starts a row), and a row starts at <|bos|> unless it continues a document. The state is
    (epoch, row) and goes into checkpoints; every rank reads the same rows and takes its own slice.
    """

    OPEN_ROWS = 256  # rows kept open for best-fit packing: more fill them better; each placement shifts a list this long

    def __init__(self, shards, bos_id, T, seed):
        self.shards, self.bos_id, self.T, self.seed = shards, bos_id, T, seed
        self.offsets = np.cumsum([0] + [len(sh) for sh in shards])  # global position of each shard's start
        bounds = []
        for sh, off in zip(shards, self.offsets):  # documents never cross shards
            starts = np.flatnonzero(np.asarray(sh) == bos_id)
            if len(starts) == 0 or starts[0] != 0:
                starts = np.concatenate([[0], starts])
            bounds.append(np.stack([starts, np.append(starts[1:], len(sh))], axis=1) + off)
        self.doc_bounds = np.concatenate(bounds)
        self.epoch, self.row = 0, 0
        self._plan_epoch = None

    def state(self):
        return {"epoch": self.epoch, "row": self.row}

    def load_state(self, state):
        rows = len(self.plan(state["epoch"])[0]) - 1
        if state["row"] > rows:  # (load_resume checked that both are whole numbers >= 0)
            raise ValueError(f"its data position is row {state['row']} of an epoch of {rows} rows")
        self.epoch, self.row = state["epoch"], state["row"]

    def read(self, start, length):
        k = np.searchsorted(self.offsets, start, side="right") - 1
        lo = start - self.offsets[k]
        return self.shards[k][lo:lo + length]

    def plan(self, epoch):
        """(ptr, segments): row r is segments[ptr[r]:ptr[r+1]], each (global start, length)."""
        if self._plan_epoch == epoch:
            return self._plan
        rng = np.random.default_rng([self.seed, epoch])
        T, R = self.T, self.T + 1
        packed, pieces = [], []
        for s, e in self.doc_bounds[rng.permutation(len(self.doc_bounds))]:
            whole = e - s <= R
            while e - s > R:         # full rows of a long document, stride T
                packed.append([(s, R)])
                s += T
            if e - s >= 2:           # a piece needs an input and a target
                pieces.append((s, e - s, whole))
        rows, room = [], []          # open rows and their free room, sorted by room
        for s, n, whole in pieces:   # best fit: the open row with the least room that still fits
            i = bisect.bisect_left(room, n)
            if whole and i < len(room):
                row, left = rows.pop(i), room.pop(i) - n
                row.append((s, n))
            else:                    # a new row; the tail of a cut document always starts one
                row, left = [(s, n)], R - n
                if len(rows) == self.OPEN_ROWS:  # close the fullest open row
                    packed.append(rows.pop(0))
                    room.pop(0)
            j = bisect.bisect_left(room, left)
            rows.insert(j, row)
            room.insert(j, left)
        packed += rows
        packed = [packed[i] for i in rng.permutation(len(packed))]
        ptr = np.cumsum([0] + [len(r) for r in packed])
        segs = np.array([seg for r in packed for seg in r], dtype=np.int64).reshape(-1, 2)
        self._plan_epoch, self._plan = epoch, (ptr, segs)
        return self._plan

    def rows_per_epoch(self):
        return len(self.plan(0)[0]) - 1

    def next_rows(self, n):
        """The next n rows as an (n, T + 1) int64 array, -1 where a row is padded."""
        out = np.full((n, self.T + 1), -1, dtype=np.int64)
        for i in range(n):
            ptr, segs = self.plan(self.epoch)
            if self.row == len(ptr) - 1:
                self.epoch, self.row = self.epoch + 1, 0
                ptr, segs = self.plan(self.epoch)
            pos = 0
            for start, length in segs[ptr[self.row]:ptr[self.row + 1]]:
                out[i, pos:pos + length] = self.read(start, length)
                pos += length
            self.row += 1
        return out


def to_batch(rows, bos_id, device):
    """(B, T + 1) rows -> inputs (B, T) and targets (B, T); padded inputs read bos, padded targets are -1."""
    rows = torch.from_numpy(rows)
    x, y = rows[:, :-1].clone(), rows[:, 1:].clone()
    x[x < 0] = bos_id
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def val_rows(val_shards, T, n_tokens):
    """A fixed validation slice: the first n_tokens of the val stream cut into rows of T + 1 at stride T."""
    data = np.concatenate(val_shards) if len(val_shards) > 1 else np.asarray(val_shards[0])
    n = min(int(n_tokens) // T, (len(data) - 1) // T)
    if n < 1:
        raise ConfigError(f"the validation split has {len(data)} tokens, fewer than one row of {T + 1}")
    return np.stack([data[i * T:i * T + T + 1].astype(np.int64) for i in range(n)])


@torch.no_grad()
def evaluate(model, rows, token_bytes, batch_size, device, autocast, rank=0, world=1):
    """Validation loss (nats per target token, <|bos|> targets included) and bits per byte: the summed nats of
    the targets that are text (special tokens have 0 bytes and are left out, as in nanochat) / ln 2 / their
    summed UTF-8 bytes."""
    model.eval()
    wide = widest_float(device)
    sums = torch.zeros(4, dtype=wide, device=device)  # nats, tokens, text nats, text bytes
    tb = torch.as_tensor(token_bytes, device=device)
    for i in range(rank * batch_size, len(rows), world * batch_size):
        x, y = to_batch(rows[i:i + batch_size], 0, device)  # val rows are never padded: the bos_id is unused
        with autocast:
            _, loss = model(x, y, reduction="none")
        nbytes = tb[y.clamp(min=0)] * (y >= 0)
        loss = loss.to(wide)
        sums += torch.stack([loss.sum(), (y >= 0).sum().to(wide), (loss * (nbytes > 0)).sum(), nbytes.sum().to(wide)])
    if world > 1:
        dist.all_reduce(sums)
    model.train()
    nats, count, text_nats, text_bytes = sums.tolist()
    return {"val_loss": nats / count, "val_bpb": text_nats / math.log(2) / text_bytes}


# -----------------------------------------------------------------------------
# checkpoints

CKPT = "ckpt.pt"


def rng_states():
    """Every RNG's state in types that torch.load(weights_only=True) accepts."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {"python": random.getstate(), "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states):
    version, internal, gauss = states["python"]  # random.getstate()'s triple; the checkpoint may hold lists
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():  # a run saved with more GPUs visible resumes on fewer
        for i, state in enumerate(states["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, i)


DATA_COUNTS = ("train_tokens", "val_tokens", "train_docs", "val_docs")  # with the tokenizer's SHA-256: which data a run read


def load_resume(path, s, model_config, tok_sha, data_counts, iters):
    """The checkpoint to continue, after checking it belongs to this run."""
    if not os.path.exists(path):
        raise ConfigError(f"--resume: no checkpoint at {path}")
    problem = unreadable_checkpoint(path)  # truncated, or a byte changed since the save
    if problem:
        raise ConfigError(f"--resume: {problem}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(f"--resume: cannot read {path} ({type(e).__name__}); it is truncated or not a checkpoint")
    if not isinstance(ckpt, dict):
        raise ConfigError(f"--resume: {path} is not a train.py checkpoint (it holds {type(ckpt).__name__!r}, not a dict)")
    kinds = dict(model=dict, model_config=dict, train_config=dict, optimizers=list, step=int, loader=dict, rng=dict, metrics=list,
                 data_dir=str, tokenizer_sha256=str, data_counts=dict, smooth_loss=float)
    for key, kind in kinds.items():
        if key not in ckpt:
            raise ConfigError(f"--resume: {path} is not a checkpoint of this train.py (no {key!r})")
        if not isinstance(ckpt[key], kind):
            raise ConfigError(f"--resume: {path} is damaged ({key!r} is a {type(ckpt[key]).__name__}, not a {kind.__name__})")
    if not all(isinstance(m, dict) and {"type", "step"} <= set(m) for m in ckpt["metrics"]):
        raise ConfigError(f"--resume: {path} is damaged (its metrics are not train.py's records)")
    # the data first: other data (another vocabulary) also makes another model, and the data is what to change
    there = ckpt["data_dir"]
    same_data = ckpt["tokenizer_sha256"] == tok_sha and ckpt["data_counts"] == data_counts
    same = os.path.realpath(s["data_dir"]) == os.path.realpath(there) or s["data_dir"] == ckpt["train_config"].get("data_dir")
    if not same and not same_data:  # a moved project, or moved data, still resumes
        raise ConfigError(f"--resume: {path} was trained on the data in {there}, this run reads {s['data_dir']}; use the same data")
    if ckpt["tokenizer_sha256"] != tok_sha:
        raise ConfigError(f"--resume: the tokenizer in {s['data_dir']} is not the one {path} was trained with (the data "
                          f"was prepared again); resume needs the same data")
    if ckpt["data_counts"] != data_counts:
        diff = ", ".join(f"{k} {ckpt['data_counts'].get(k)} there, {data_counts[k]} here" for k in DATA_COUNTS
                         if ckpt["data_counts"].get(k) != data_counts[k])
        raise ConfigError(f"--resume: the data in {s['data_dir']} is not the data {path} was trained on ({diff}: it was "
                          f"prepared again); resume needs the same data")
    saved, now = ckpt["model_config"], asdict(model_config)
    if unknown := sorted(set(saved) - set(now)):
        raise ConfigError(f"--resume: {path} names model settings this code does not have ({', '.join(unknown)}): a "
                          f"checkpoint of another version of model.py; use that version, or another --out_dir")
    saved = {**{f.name: f.default for f in fields(GPTConfig)}, **saved}  # a field it predates: its default, as sample.py reads it
    preset = {k: ckpt["train_config"].get(k) for k in ("size", "variant")}
    # another preset: named, not the fields or rates it sets; a variant of the same model (baseline, t1_r01) resumes
    if preset["size"] != s["size"] or (saved != now and preset["variant"] != s["variant"]):
        raise ConfigError(f"--resume: {path} is a --size={preset['size']} --variant={preset['variant']} run, this one "
                          f"--size={s['size']} --variant={s['variant']}; use the same, or another --out_dir")
    if saved != now:  # said as the flags that give them: --bov_layers=2,3, not (2, 3)
        flag = lambda v: ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v).lower() if isinstance(v, bool) else str(v)
        differ = [k for k in now if saved[k] != now[k]]
        diff = ", ".join(f"{k}={flag(saved[k])} there, {flag(now[k])} here" for k in differ)
        flags = " ".join(f"--{k}={flag(saved[k])}" for k in differ)
        raise ConfigError(f"--resume: {path} is a different model ({diff}); use the same settings ({flags}) or another --out_dir")
    # the weights' names and shapes (a meta model: no memory); another float dtype is converted by the load
    want = {k: tuple(v.shape) for k, v in GPT.meta(model_config).state_dict().items()}
    got = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__ for k, v in ckpt["model"].items()}
    if got != want:
        bad = sorted(map(str, set(want) ^ set(got))) + [k for k in want if k in got and got[k] != want[k]]
        raise ConfigError(f"--resume: {path} is damaged (its weights do not fit the model it names: "
                          f"{', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})")
    must_match = ("seed", "total_batch_tokens", "target_flops", "target_tokens", "max_iters", "matrix_lr",
                  "embedding_lr", "unembedding_lr", "scalar_lr", "table_lr", "weight_decay", "warmup_iters",
                  "warmdown_frac", "final_lr_frac")
    saved, budgets = ckpt["train_config"], ("target_flops", "target_tokens", "max_iters")
    # short where exact (1e+07, not 10000000.0), every digit where not (0.0123456789)
    show = lambda v: (f"{v:g}" if float(f"{v:g}") == v else repr(v)) if isinstance(v, float) else str(v)
    differ = [k for k in must_match if saved.get(k) != s[k]]
    if differ:
        diff = ", ".join(f"{k}={show(saved.get(k))} there, {show(s[k])} here" for k in differ)
        unrecorded = [k for k in differ if k not in saved]  # settings added to train.py after the checkpoint was written
        if unrecorded:  # what the run used before they existed is unknown: no flags can give it
            raise ConfigError(f"--resume: {path} was trained with other settings ({diff}): {', '.join(unrecorded)} not "
                              f"recorded there, the checkpoint predates the setting, so this code cannot resume it")
        # the flags that give the checkpoint's settings (a budget left 0 there follows from the one given)
        flags = " ".join(f"--{k}={show(saved[k])}" for k in differ if not (k in budgets and not saved[k]))
        raise ConfigError(f"--resume: {path} was trained with other settings ({diff}); use the same ones"
                          + (f" ({flags})" if flags else "")
                          + (" (the learning-rate schedule is planned from the budget, so a run cannot be lengthened)"
                             if any(k in budgets for k in differ) else ""))
    if not 0 <= ckpt["step"] <= iters:
        raise ConfigError(f"--resume: {path} is at step {ckpt['step']}, outside this run's 0..{iters} iterations; it is damaged")
    where = ckpt["loader"]  # a dict (checked above): the data's epoch and row (Batches.state), whole numbers for its seed
    if not all(type(where.get(k)) is int and where[k] >= 0 for k in ("epoch", "row")):
        raise ConfigError(f"--resume: {path} is damaged (its data position {where!r} is not an epoch and a row >= 0)")
    return ckpt


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; kill, timeout, Slurm, docker stop


def stop_signal(signum, frame):
    """Ctrl-C and SIGTERM alike: a KeyboardInterrupt, and the script exits 128 + the signal's number. Once the
    script's own handler, the signals that follow are ignored: Slurm and torchrun both send one, and a
    second must not cut main()'s cleanup short (the next Ctrl-C or SIGTERM is a no-op; kill -9 remains)."""
    RUN["signal"] = signum
    if signal.getsignal(signum) is stop_signal:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextmanager
def ctrl_c_after():
    """Hold a Ctrl-C or SIGTERM until the block ends, then raise it: a checkpoint save is never cut short."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread receives signals
        yield
        return
    caught = []
    previous = handle_signals({sig: lambda signum, _: caught.append(signum) for sig in STOP_SIGNALS})  # (not an ignored one)
    try:
        yield
    finally:
        handle_signals(previous)
    if caught:
        stop_signal(caught[0], None)


def write_jsonl(path, records):
    atomic_write(path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in records).encode()))


# -----------------------------------------------------------------------------
# devices and ranks

def ranks():
    """(ddp, rank, local_rank, world) from torchrun's environment; one process without it."""
    if os.environ.get("RANK", "-1") == "-1":
        return False, 0, 0, 1
    env = {k: os.environ.get(k, "") for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    rank, local_rank, world = (int(env[k]) if env[k].isdecimal() else -1 for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if not (0 <= local_rank <= rank < world and env["MASTER_ADDR"] and env["MASTER_PORT"]):
        found = ", ".join(f"{k}={v!r}" for k, v in env.items() if k in os.environ)
        raise ConfigError(f"RANK is set, but torchrun's environment is incomplete or invalid ({found}; torchrun sets RANK, LOCAL_RANK "
                          f"and WORLD_SIZE, 0 <= LOCAL_RANK <= RANK < WORLD_SIZE, MASTER_ADDR and MASTER_PORT); start with "
                          f"torchrun, or unset RANK for one process")
    return True, rank, local_rank, world


class PeerStopped(Exception):
    """On a rank other than 0: rank 0 failed a check that it alone makes and printed why; this rank stops quietly."""


def on_rank0(ddp, master, fn):
    """fn() on rank 0 alone -> its result (None on the other ranks). Under torchrun the other ranks then learn
    whether it raised, and stop too (PeerStopped), rather than wait for rank 0 in their next collective."""
    result, error = None, None
    if master:
        try:
            result = fn()
        except Exception as e:  # raised below, once the other ranks know
            error = e
    if ddp:
        failed = [error is not None]
        dist.broadcast_object_list(failed, src=0)
        if failed[0] and not master:
            raise PeerStopped()
    if error is not None:
        raise error
    return result


def peer_lost(e):
    """Whether e is a gloo collective that failed because another rank left (the connection the peer closed or
    reset). Under NCCL a rank waits for a lost peer until torchrun stops it; other errors keep their own message."""
    text = str(e)
    return isinstance(e, RuntimeError) and "gloo" in text and " by peer" in text


def setup_device(s):
    ddp, _, local_rank, _ = ranks()
    name = s["device"]
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
        if name == "cpu" and s["size"] != "cpu":  # a paper size, meant for a GPU: say why none was found
            if torch.version.cuda:
                why = (f"none in this machine, hidden by CUDA_VISIBLE_DEVICES, or a driver older than this torch's CUDA "
                       f"{torch.version.cuda}")
            elif torch.version.hip:
                why = "none visible to this ROCm build of torch"
            else:
                why = f"this torch, {torch.__version__}, is built without CUDA"
            raise ConfigError(f"--device=auto found no GPU ({why}), and --size={s['size']} is meant for one; pass "
                              f"--device=cpu to run it on the CPU anyway (README, GPU quick start)")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device={name} but no CUDA device is visible")
        name = f"cuda:{local_rank}" if ddp else (name if ":" in name else "cuda:0")  # set_device needs an index
        try:  # first, so that this process makes no CUDA context on another rank's GPU
            torch.cuda.set_device(name)
        except (RuntimeError, ValueError, AssertionError) as e:  # e.g. an index past the last GPU
            RUN["alike"] = False  # this rank's own: the ranks before it have their GPUs
            why = f" (torchrun's LOCAL_RANK={local_rank}: more --nproc_per_node than GPUs?)" if ddp else ""
            raise ConfigError(f"--device {name}{why} is not usable here: {first_line(e)}") from None
    if name == "meta":
        raise ConfigError("--device=meta holds no data to train on; --dry_run prints the plan without memory")
    try:
        check_device(name)  # torch's own messages can run to a thousand characters
    except ValueError as e:
        if name.startswith("cuda:"):  # one rank's GPU may fail alone
            RUN["alike"] = False
        raise ConfigError(str(e)) from None
    keep_freed_memory(name)
    dev = torch.device(name)
    if ddp:
        # Blocked in here, waiting for a rank that failed, a process cannot run Python's signal handlers, and
        # torchrun's SIGTERM would wait 30 s for its SIGKILL: the default handlers stop it at once (nothing is
        # held or written yet).
        handlers = handle_signals({sig: signal.SIG_DFL for sig in STOP_SIGNALS})
        try:
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        finally:
            handle_signals(handlers)
    return dev


# -----------------------------------------------------------------------------
# the run: its stages (plan, out_dir, data, resume, the model the loop calls), main() and run()

def read_meta(data_dir):
    """load_meta, unlocked; when there is no complete meta.json because another process is writing the folder
    now (prepare_data.py preparing it; or, by mistake, a train.py with it as --out_dir), that is the error (not
    're-run prepare_data.py')."""
    try:
        return load_meta(data_dir)
    except DataError:
        if being_written(data_dir):
            raise DataError(f"{data_dir} is being written by another process (prepare_data.py preparing it, or a "
                            f"train.py whose --out_dir it is); wait for it to finish") from None
        raise


def plan(s, model_overrides, world, log):
    """The model and the budget, printed -> (meta, model_config, flops_per_token, iters, tokens, accum), accum the
    gradient-accumulation steps that split a step's batch over device batches and ranks.

    Needs only the model's shapes (a meta-device model) and of the data only meta.json; meta is None
    for a dry run without the data."""
    if s["device"] != "auto":  # a dry run may plan a GPU run on a machine without one, not on a device torch never heard of
        try:
            torch.device(s["device"])
        except (RuntimeError, ValueError):
            raise ConfigError(f"--device {s['device']} is not usable here: {UNKNOWN_DEVICE}") from None
    meta = None
    if not s["dry_run"] or os.path.exists(os.path.join(s["data_dir"], "meta.json")) or os.path.isfile(s["data_dir"]):
        # the dry run too when the data is there (or --data_dir is a file: load_meta says so)
        meta = read_meta(s["data_dir"])
        model_overrides.setdefault("vocab_size", meta["vocab_size"])  # the model's vocabulary is the data's unless given
    try:
        model_config = GPTConfig.preset(s["size"], s["variant"], **model_overrides)
    except ValueError as e:
        raise ConfigError(str(e))
    if meta is None:  # a dry run without the data: say what it assumed
        log(f"note: {s['data_dir']} is not prepared yet (`{prepare_command(s['data_dir'])}`); this plan assumes "
            f"vocab_size {model_config.vocab_size}, the size's")
    else:  # the dry run checks this too
        if model_config.vocab_size < meta["vocab_size"]:
            raise ConfigError(f"vocab_size {model_config.vocab_size} is smaller than the data's vocabulary ({meta['vocab_size']})")
        if model_config.vocab_size > np.iinfo(np.dtype(meta["dtype"])).max + 1:
            raise ConfigError(f"vocab_size {model_config.vocab_size} is larger than the data's {meta['dtype']} ids can hold")
    # a run's name (and out_dir) says which value variant it trains: the settings must not contradict it. Its target
    # layers may move (--bov_layers), but what a target layer computes is the variant's own
    grid = ("value_source", "value_mix", "value_coeff", "shared_table")
    own = GPTConfig.preset(s["size"], s["variant"]) if set(grid) & set(model_overrides) else model_config
    changed = [k for k in grid if getattr(model_config, k) != getattr(own, k)]
    if changed:
        wanted = {k: getattr(model_config, k) for k in grid}
        named = sorted((v for v, fields in VARIANTS.items() if fields and all(fields.get(k, getattr(GPTConfig, k)) == wanted[k]
                                                                         for k in grid)),  # those with these layers first
                       key=lambda v: VARIANTS[v]["bov_layers"] != model_config.bov_layers)
        raise ConfigError(f"{', '.join(f'--{k}={getattr(model_config, k)}' for k in changed)} would train another value "
                          f"variant under {s['variant']}'s name" + (f"; it is --variant={named[0]}" if named else
                          "; add it to VARIANTS in model.py") + " (a variant's target layers may move with --bov_layers)")
    standard, targets = not VARIANTS[s["variant"]], model_config.target_layers()  # standard: baseline, t1_r01
    if standard and targets:
        raise ConfigError(f"--variant={s['variant']} has no target layers; --bov_layers would train a value variant under "
                          f"its name: start from one that has them, e.g. --variant=bov --bov_layers=...")
    if not standard and not targets:  # --bov_layers=none, or a depth where the variant's layers are none
        raise ConfigError(f"--variant={s['variant']} has no target layers here (bov_layers={model_config.bov_layers!r} at "
                          f"n_layer={model_config.n_layer}), so it is standard attention under a value variant's name: "
                          f"train it as --variant=baseline")
    shapes = GPT.meta(model_config)
    flops_per_token = shapes.estimate_flops()
    counts = shapes.num_params()
    iters = plan_iterations(s, flops_per_token)
    RUN["eval_interval"] = min(s["eval_interval"], iters)  # the last step evaluates and saves too
    T = model_config.block_size
    if s["eval_tokens"] < T:  # checked here, not at the data, so that --dry_run says it too
        raise ConfigError(f"--eval_tokens={s['eval_tokens']} is less than one row of block_size={T} tokens")
    tokens = iters * s["total_batch_tokens"]

    log(f"settings: {json.dumps(s, sort_keys=True)}")
    log(f"model: {json.dumps(asdict(model_config))}")
    log(f"plan: {s['size']} / {s['variant']}: {counts['dense']:,} dense parameters ({counts['dense'] / 1e6:.1f}M)"
        f" + {counts['tables']:,} in value tables; target layers {list(model_config.target_layers()) or 'none'}")
    log(f"plan: {flops_per_token:,} FLOPs/token ({flops_per_token:.3e}), {s['total_batch_tokens']:,} tokens/step")
    budget = (f"{s['target_flops']:.3g} FLOPs" if s["target_flops"] else
              f"{s['target_tokens']:,} tokens" if s["target_tokens"] else "--max_iters")
    human = f"{tokens / 1e9:.2f}B" if tokens >= 1e8 else f"{tokens / 1e6:.2f}M"
    log(f"plan: {budget} -> {iters:,} iterations, {tokens:,} tokens ({human}), "
        f"{flops_per_token * tokens:.3g} FLOPs, tokens:params {tokens / counts['scaling']:.3g} "
        f"(over the {counts['scaling'] / 1e6:.2f}M matrix weights, Table 6's base)")
    if s["total_batch_tokens"] % (s["device_batch_size"] * T * world):
        largest = min(s["device_batch_size"], s["total_batch_tokens"] // (T * world))
        fits = next((b for b in range(largest, 0, -1) if s["total_batch_tokens"] % (b * T * world) == 0), None)
        raise ConfigError(f"total_batch_tokens {s['total_batch_tokens']:,} is not a multiple of "
                          f"device_batch_size x block_size x ranks = {s['device_batch_size']} x {T} x {world}; "
                          + (f"e.g. --device_batch_size={fits}" if fits else f"give a multiple of {T * world:,}"))
    accum = s["total_batch_tokens"] // (s["device_batch_size"] * T * world)
    log(f"plan: {s['total_batch_tokens']:,} tokens/step = {s['device_batch_size']} x {T} tokens x {accum} accumulation "
        f"x {world} ranks")
    if s["warmup_iters"] >= iters:
        log(f"WARNING: warmup_iters={s['warmup_iters']} is not below the run's {iters} iterations: the whole run is "
            f"warm-up; lower --warmup_iters or raise the budget")
    # the first step after the warm-up below the peak: the warmdown began before the warm-up ended (e.g. --max_iters=20:
    # 10 warm-up steps, 13 of warmdown); 0.995, so that a drop the note would print as 1.00 is not told of. Steps are
    # counted from 1 there, as in the log's "step N/M" lines (lr_multiplier's step is 0-based)
    elif (after := lr_multiplier(s["warmup_iters"], iters, s["warmup_iters"], s["warmdown_frac"], s["final_lr_frac"])) < 0.995:
        log(f"note: the warmdown (the last {round(s['warmdown_frac'] * iters)} of {iters} steps) begins before the "
            f"warm-up ends: the rate rises to its peak over {s['warmup_iters']} steps, then drops to {after:.2f} of it "
            f"at step {s['warmup_iters'] + 1}, with no constant phase (lower --warmup_iters or --warmdown_frac to keep one)")
    if s["dry_run"] and meta is not None and tokens > meta["train_tokens"]:  # the real run counts rows (padding included)
        log(f"WARNING: this run would read about {tokens / meta['train_tokens']:.2f} epochs of {s['data_dir']} "
            f"({meta['train_tokens']:,} train tokens); {EPOCH_ADVICE}")
    return meta, model_config, flops_per_token, iters, tokens, accum


def claim_out_dir(s, made, ddp, master, ckpt_path):
    """Refuse an unusable --out_dir (every rank); on rank 0, lock it, hand it to main() to remove until the
    first checkpoint (made: what missing_top found missing), and drop half-written checkpoints. Under torchrun
    the other ranks learn whether rank 0 got the lock, and stop (PeerStopped) when it did not."""
    problem = out_dir_problem(s["out_dir"])  # on every rank: each stops with the same line
    if os.path.realpath(s["out_dir"]) == os.path.realpath(s["data_dir"]):  # (its lock would read as another run's)
        problem = "is the data folder (--data_dir); choose another --out_dir"
    if problem:
        raise ConfigError(f"--out_dir {s['out_dir']} {problem}")
    def claim():  # one run per --out_dir: a second would overwrite the first's checkpoint and metrics
        RUN["out_lock"] = lock_folder(s["out_dir"], True, f"another train.py is writing {s['out_dir']}; wait for it to "
                                                          f"end, or choose another --out_dir")
        # ours once locked (a run refused here never removes the winner's folder); whatever stops this run before
        # its first checkpoint, main() removes the folder again
        RUN["made"] = (s["out_dir"], made)
        for stale in glob.glob(glob.escape(ckpt_path) + ".tmp*"):  # half a save by a killed run: no one else writes here
            os.remove(stale)
    on_rank0(ddp, master, claim)


def lock_data(s, meta):
    """Lock the data folder for reading -> (tok_sha, data_counts), which data this run reads: a checkpoint records
    them, sample.py and eval.py check the tokenizer's hash, and a resume checks both."""
    RUN["data_lock"] = lock_folder(s["data_dir"], False, f"{s['data_dir']} is being written by prepare_data.py; "
                                                         f"wait for it to finish")  # and it waits for this run
    if load_meta(s["data_dir"]) != meta:  # plan() read it unlocked
        raise ConfigError(f"{s['data_dir']} was prepared again as this run started; start it again")
    # read as sample.py and eval.py will: a checkpoint records the tokenizer's hash, so one trained beside a damaged
    # tokenizer could never be read, nor resumed, once the tokenizer is mended
    load_tokenizer(s["data_dir"])
    return tokenizer_sha256(s["data_dir"]), {k: meta[k] for k in DATA_COUNTS}


def load_data(s, meta, model_config, tokens, log):
    """Load the (locked) data folder -> (loader, val, token_bytes)."""
    T = model_config.block_size
    loader = Batches(load_tokens(s["data_dir"], "train"), meta["bos_id"], T, s["seed"])
    val = val_rows(load_tokens(s["data_dir"], "val"), T, s["eval_tokens"])
    token_bytes = load_token_bytes(s["data_dir"])
    epoch_tokens = loader.rows_per_epoch() * T
    log(f"data: {s['data_dir']}: {meta['train_tokens']:,} train tokens, {loader.rows_per_epoch():,} rows of {T + 1} per epoch;"
        f" validation slice {len(val) * T + 1:,} tokens")  # rows overlap by one token
    if tokens > epoch_tokens:
        log(f"WARNING: this run reads {tokens / epoch_tokens:.2f} epochs of {s['data_dir']}; {EPOCH_ADVICE}")
    return loader, val, token_bytes


def checked_start(ckpt_path, s, model_config, tok_sha, data_counts, iters):
    """Before anything is loaded or built: the checkpoint that --resume continues, checked to belong to this run;
    None for a fresh start, in an out_dir that must then hold no checkpoint."""
    if s["resume"]:
        return load_resume(ckpt_path, s, model_config, tok_sha, data_counts, iters)
    if os.path.exists(ckpt_path):
        raise ConfigError(f"{ckpt_path} exists; pass --resume to continue that run, or choose another --out_dir")
    left = [n for n in ("metrics.jsonl", "core_eval.json", "core_eval_partial.json")
            if os.path.exists(os.path.join(s["out_dir"], n))]
    if left:  # its checkpoint deleted or moved away: a new run would replace them, or sit beside scores not its own
        names = " and ".join([", ".join(left[:-1]), left[-1]] if len(left) > 1 else left)
        raise ConfigError(f"{s['out_dir']} holds {names} of an earlier run, but no {CKPT}; move "
                          f"{'them' if len(left) > 1 else 'it'} away to train there, or choose another --out_dir")
    return None


def restore(ckpt, ckpt_path, s, model, optimizers, loader, iters, log):
    """The checked checkpoint's weights, optimizer, loader and RNG states -> (step, metrics, smooth loss); a fresh
    start (ckpt None) -> (0, [], 0.0)."""
    if ckpt is None:
        return 0, [], 0.0
    try:
        model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, ckpt["optimizers"], strict=True):
            opt.load_state_dict(state)
        loader.load_state(ckpt["loader"])
        set_rng_states(ckpt["rng"])
        step, metrics = int(ckpt["step"]), list(ckpt["metrics"])
        smooth = ckpt["smooth_loss"]
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise ConfigError(f"--resume: {ckpt_path} is damaged ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    log(f"resumed {ckpt_path} at step {step}")
    if ckpt["train_config"].get("eval_tokens") != s["eval_tokens"] and step < iters:  # allowed; the yardstick may change
        log(f"WARNING: eval_tokens was {ckpt['train_config'].get('eval_tokens')} there and is {s['eval_tokens']} here: "
            f"val losses after step {step} may be measured on another slice than those before")
    scores = [n for n in ("core_eval.json", "core_eval_partial.json") if os.path.exists(os.path.join(s["out_dir"], n))
              and not (s["core_eval"] and n == "core_eval.json")]  # --core_eval: rewritten for the final checkpoint
    if scores and step < iters:  # eval.py's results of a checkpoint that this run goes on to replace
        log(f"note: {' and '.join(scores)} in {s['out_dir']} score{'s' * (len(scores) == 1)} the checkpoint of step {step} "
            f"or an earlier one, not the one this run ends with: run eval.py again after it")
    return step, metrics, smooth


def autocast_dtype(s, dev):
    """--dtype -> the autocast dtype of training, validation and CORE (float32: no autocast). auto is bf16 on a GPU
    with bf16 in hardware and float32 elsewhere: on an older GPU (T4, V100) bf16 is emulated and left uncompiled,
    and float16 training would need a loss scaler, which this loop has not."""
    if s["dtype"] == "auto":
        return torch.bfloat16 if dev.type == "cuda" and bf16_in_hardware(dev) else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[s["dtype"]]


def training_model(s, model, dev, ddp, world=1):
    """The model the loop calls, compiled and DDP-wrapped as the settings say -> (train_model, autocast,
    peak: the GPU's dense bf16 FLOP/s, None where unknown or not training in bf16, the line that says how it runs)."""
    use_cuda = dev.type == "cuda"
    if use_cuda:
        torch.set_float32_matmul_precision("high")  # TF32
    dtype = autocast_dtype(s, dev)
    autocast = sample_autocast(dev, dtype)
    train_model = model
    compiled = s["compile"] == "true" or (s["compile"] == "auto" and use_cuda)
    if compiled:
        train_model = torch.compile(model)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        train_model = DistributedDataParallel(train_model, device_ids=[dev.index] if use_cuda else None)
    gpu = torch.cuda.get_device_name(dev) if use_cuda else None
    # MFU is against the GPU's bf16 peak (PEAK_FLOPS): a float32 run's TF32 matmuls have another, so it gets none
    peak = peak_flops(gpu) if gpu and dtype == torch.bfloat16 else None
    line = (f"device: {dev}" + (f" ({gpu})" if gpu else "")
            + (f" x {world} ranks (DDP)" if ddp else "")
            + (f", {str(dtype).removeprefix('torch.')} autocast" if dtype != torch.float32 else ", float32")
            + (", torch.compile" if compiled else ", eager"))
    return train_model, autocast, peak, line


def main(argv):
    """Train as the settings in argv say; the folder locks taken on the way are dropped when it returns or raises."""
    RUN.clear()
    RUN["ckpt"] = None
    RUN["rank"], RUN["alike"] = 0, True
    try:
        _, RUN["rank"], _, _ = ranks()  # before the settings, which may be what fails (a bad environment: rank 0 says so)
        # on one machine every rank reads the same files: an error of the settings, data or checkpoint is met alike
        RUN["alike"] = os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE")
        return run(argv)
    finally:
        if RUN.get("made"):  # a run that ended before its first checkpoint leaves no folder; done under its lock
            remove_unused(*RUN.pop("made"))
        for key in ("out_lock", "data_lock"):
            if RUN.get(key):
                RUN.pop(key).close()


def run(argv):
    """Plan, data, model, then the training loop; returns the last evaluation's record (None for a dry run)."""
    s, model_overrides = resolve_settings(argv)
    RUN["ckpt"] = os.path.join(s["out_dir"], CKPT)
    ddp, rank, _, world = ranks()  # (False, 0, _, 1) without torchrun; main() has put the rank in RUN
    master = rank == 0
    log = say if master else (lambda *a, **k: None)
    RUN["dry_run"] = s["dry_run"]

    # the plan: printed, and all a dry run does
    meta, model_config, flops_per_token, iters, tokens, accum = plan(s, model_overrides, world, log)
    if s["dry_run"]:
        return None

    # the device (DDP starts here) and out_dir
    # what out_dir_problem will make, seen before any rank makes it (init_process_group waits for every rank)
    made = missing_top(s["out_dir"]) if master else None
    dev = setup_device(s)
    ckpt_path = RUN["ckpt"]
    claim_out_dir(s, made, ddp, master, ckpt_path)
    # which data, and the checkpoint to continue: both checked before anything is loaded or built
    tok_sha, data_counts = lock_data(s, meta)
    ckpt = checked_start(ckpt_path, s, model_config, tok_sha, data_counts, iters)
    if s["core_eval"]:  # what CORE needs: the bundle and the tokenizer before training, not after it; rank 0 runs CORE alone
        from eval import load_bundle
        core_bundle, core_tokenizer = on_rank0(ddp, master, lambda: (
            load_bundle(s["eval_bundle"] or None, flag="--eval_bundle"), load_tokenizer(s["data_dir"]))) or (None, None)

    # data
    loader, val, token_bytes = load_data(s, meta, model_config, tokens, log)

    # model and optimisers, restored with --resume
    torch.manual_seed(s["seed"])
    random.seed(s["seed"])
    np.random.seed(s["seed"])
    model = GPT(model_config, device=dev)
    optimizers = model.configure_optimizers(s["matrix_lr"], s["embedding_lr"], s["unembedding_lr"],
                                            s["scalar_lr"], s["table_lr"], s["weight_decay"])
    # smooth: a moving average (weight LOSS_EMA) of the steps' losses from 0; the log divides it by 1 - LOSS_EMA^step
    step, metrics, smooth = restore(ckpt, ckpt_path, s, model, optimizers, loader, iters, log)
    del ckpt  # copied into the model, or held by the optimizers' states
    metrics_path = os.path.join(s["out_dir"], "metrics.jsonl")
    if master and s["resume"]:  # the checkpoint's metrics, without any logged after it
        write_jsonl(metrics_path, metrics)
    train_model, autocast, peak, line = training_model(s, model, dev, ddp, world)
    log(line)

    def checkpoint(step, smooth):
        """ckpt.pt, then metrics.jsonl to match it; a Ctrl-C meanwhile is raised once both are written."""
        with ctrl_c_after():
            try:
                model.save_checkpoint(ckpt_path, train_config=s, data_dir=os.path.abspath(s["data_dir"]),
                                      tokenizer_sha256=tok_sha, data_counts=data_counts, step=step,
                                      optimizers=[o.state_dict() for o in optimizers], loader=loader.state(),
                                      rng=rng_states(), metrics=metrics, smooth_loss=smooth)
            except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
                kept = f"the last good checkpoint {ckpt_path} is kept" if os.path.exists(ckpt_path) else "no checkpoint was written"
                raise ConfigError(f"could not write the checkpoint at step {step} ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}; is the disk full?); {kept}") from None
            write_jsonl(metrics_path, metrics)

    def run_eval(step):
        """Evaluate, append the record (with the target layers' coefficients, the paper's Fig 2) to metrics, log it."""
        r = evaluate(model, val, token_bytes, s["device_batch_size"], dev, autocast, rank, world)
        rec = {"type": "eval", "step": step, "tokens": step * s["total_batch_tokens"],
               "flops": step * s["total_batch_tokens"] * flops_per_token, **r,
               "coefficients": {str(k): v for k, v in model.coefficient_values().items()}}
        metrics.append(rec)
        coeffs = " ".join(f"L{k}:" + ",".join(f"{x:.2f}" for x in v.values()) for k, v in rec["coefficients"].items())
        log(f"eval step {step}: val loss {r['val_loss']:.4f}, val bpb {r['val_bpb']:.4f}" + (f" | coeff {coeffs}" if coeffs else ""))
        return rec

    def check_in_vocab(rows, split):
        """A damaged shard: one line, not a traceback mid-run. Against the data's vocabulary (token_bytes holds one entry
        per id), which a model's --vocab_size may exceed (its extra rows are never targets)."""
        if rows.size and rows.max() >= len(token_bytes):
            raise DataError(f"the {split} data in {s['data_dir']} holds token id {rows.max()}, outside its vocabulary of "
                            f"{len(token_bytes)}: it is damaged; re-run prepare_data.py with --force")
    check_in_vocab(val, "validation")

    def check_finite(value, what, step):
        if not math.isfinite(value):
            RUN["alike"] = True  # losses are averaged over the ranks: every rank stops here, rank 0 alone says so
            kept = f"the last good checkpoint is {ckpt_path}" if os.path.exists(ckpt_path) else "no checkpoint was written"
            raise ConfigError(f"{what} is {value} at step {step}; stopping ({kept}). Try a lower learning rate.")

    # the loop
    t_start = t_last = time.time()
    start_step = step
    # a resumed checkpoint was saved right after evaluating its step: that evaluation is not repeated
    evaluated_step = step if any(m["type"] == "eval" and m["step"] == step for m in metrics) else None
    while True:
        last = step == iters
        if (step % s["eval_interval"] == 0 or last) and step != evaluated_step:
            check_finite(run_eval(step)["val_loss"], "val loss", step)
            if master and (step > start_step or last):  # the starting step's weights are saved already (or untrained)
                checkpoint(step, smooth)
            t_last = time.time()  # the step timings leave out evaluation and checkpointing
        if last:
            break
        # the schedule: each group's peak rate (initial_lr, set by configure_optimizers: Muon's matrices; AdamW's
        # embedding, lm_head, tables, scalars) times lrm; Muon's weight decay is lr x weight_decay, so it follows too
        lrm = lr_multiplier(step, iters, s["warmup_iters"], s["warmdown_frac"], s["final_lr_frac"])
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = g["initial_lr"] * lrm
        epoch_before = loader.epoch
        step_rows = loader.next_rows(s["device_batch_size"] * accum * world)
        check_in_vocab(step_rows, "train")
        if loader.epoch != epoch_before:
            log(f"WARNING: step {step + 1} starts epoch {loader.epoch + 1} of {s['data_dir']}: the run is past a single epoch")
        # the step's loss is the mean over all its target tokens, on every rank and in every micro-batch: padded rows
        # make micro-batches hold different numbers of targets, so a mean of their means would weigh a token by how
        # device_batch_size and the ranks split the step. Every rank reads the whole step, so it knows the count.
        n_targets = max(1, int((step_rows[:, 1:] >= 0).sum()))
        loss_sum = 0.0
        for micro in range(accum):
            lo = (micro * world + rank) * s["device_batch_size"]
            x, y = to_batch(step_rows[lo:lo + s["device_batch_size"]], meta["bos_id"], dev)
            sync = nullcontext() if not ddp or micro == accum - 1 else train_model.no_sync()
            with sync, autocast:
                _, loss = train_model(x, y, reduction="sum")
            (loss * (world / n_targets)).backward()  # x world: DDP averages the ranks' gradients
            loss_sum += loss.detach()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        if ddp:
            loss_sum = torch.as_tensor(loss_sum, dtype=torch.float32, device=dev)
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        loss_val = float(loss_sum) / n_targets
        check_finite(loss_val, "loss", step + 1)  # the step the log calls it
        step += 1
        smooth = LOSS_EMA * smooth + (1 - LOSS_EMA) * loss_val
        now = time.time()
        dt, t_last = now - t_last, now
        if step % s["log_interval"] == 0 or step == iters:
            smooth_debiased = smooth / (1 - LOSS_EMA ** step)  # the average started at 0
            tok_s = s["total_batch_tokens"] / dt
            used = f" | mfu {mfu(flops_per_token, tok_s, peak, world):.1f}%" if peak else ""
            eta = (now - t_start) / (step - start_step) * (iters - step)
            log(f"step {step}/{iters} | loss {smooth_debiased:.4f} | lrm {lrm:.2f} | "
                f"dt {dt * 1000:.0f} ms | tok/s {tok_s:,.0f}{used} | eta {eta / 60:.1f}m")
            # the step's own loss (the log shows the moving average); metrics.jsonl is written at each checkpoint
            metrics.append({"type": "train", "step": step, "tokens": step * s["total_batch_tokens"], "loss": loss_val, "lrm": lrm})

    final = metrics[-1] if metrics and metrics[-1]["type"] == "eval" else run_eval(step)
    if ddp:  # leave together before CORE, which rank 0 runs alone: a rank kept waiting would hit NCCL's timeout
        del train_model  # the DDP wrapper first
        dist.barrier()
        dist.destroy_process_group()
    if master:
        since = f" since the resume at step {start_step}" if start_step else ""  # earlier sessions' time is not kept
        log(f"done: {step} steps, {step * s['total_batch_tokens']:,} tokens, val bpb {final['val_bpb']:.4f}, "
            f"{(time.time() - t_start) / 60:.1f} min{since}; checkpoint {ckpt_path}")
        if s["core_eval"]:
            from eval import evaluate_core
            result = evaluate_core(model, core_tokenizer, device=dev, loaded=core_bundle, dtype=autocast_dtype(s, dev))
            result["ckpt"], result["step"] = os.path.abspath(ckpt_path), step
            core_path = os.path.join(s["out_dir"], "core_eval.json")  # what eval.py writes for the same checkpoint
            write_json(core_path, result)
            log(f"CORE {result['core']:.4f}; wrote {core_path}")
    return final


def say(*args):
    """print() for the run's log: a stdout that cannot take it (a full disk) stops the run naming stdout, not as if a
    checkpoint had failed; a reader that left (BrokenPipeError) is __main__'s to report."""
    try:
        print(*args)
    except BrokenPipeError:
        raise
    except OSError as e:
        silence_stdout()  # Python's flush at exit would fail again
        raise OSError(f"cannot write the log to stdout: {e.strerror or e}") from None


def stopped_note():
    """What a stopped run leaves, for its last line."""
    if RUN.get("dry_run"):
        return "a dry run writes nothing"
    if RUN["ckpt"] and os.path.exists(RUN["ckpt"]):
        return f"{RUN['ckpt']}, from the last evaluation, continues with --resume"
    if "eval_interval" not in RUN:  # stopped before the plan knew the iterations
        return "no checkpoint was written yet"
    return f"no checkpoint was written yet (the first comes at step {RUN['eval_interval']})"


def error_line(e, rank, alike):
    """The one line that reports a run stopped by e on this rank; "" when this rank stays quiet, None when e is
    not a stop but a bug. Under torchrun rank 0 speaks for the run: an error that every rank meets alike (alike:
    RUN["alike"] when e was raised) and a lost peer are rank 0's to report; another rank reports its own
    failures, its rank named."""
    from eval import EvalError
    ours = (ConfigError, DataError, EvalError)
    met_alike = alike and (isinstance(e, (*ours, OSError)) or compile_failed(e))  # (no compiler: no rank has one)
    if isinstance(e, PeerStopped) or (rank > 0 and (peer_lost(e) or met_alike)):
        return ""
    oom = next((x for x in (e, e.__cause__) if out_of_memory(x)), None)  # __cause__: inside torch.compile
    if oom:
        line = (f"error: out of memory ({first_line(oom)}); lower --device_batch_size (the accumulation steps keep "
                "--total_batch_tokens), --total_batch_tokens (a step's rows are read at once) or the model size")
    elif compile_failed(e):
        line = f"error: torch.compile failed ({first_line(e)}); run with --compile=false"
    elif peer_lost(e):  # on rank 0: the rank that left said why, or torchrun's report does
        line = f"error: another rank left the run (its line is above, or in torchrun's report); {stopped_note()}"
    elif isinstance(e, (*ours, OSError)):
        line = f"error: {e}"
    else:
        return None
    return line if rank == 0 else f"rank {rank}: {line}"


def usage():
    """--help: the docstring, then every setting with its default."""
    keys = "\n".join(f"  --{k}={globals()[k]!r}" + ("  (out/<size>_<variant>)" if k == "out_dir" else "") for k in TRAIN_KEYS)
    sizes = "\n".join(f"  {name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())
                      for name, d in SIZE_DEFAULTS.items())
    return (f"{__doc__.strip()}\n\nTraining settings and their defaults:\n{keys}\n"
            f"\nWhat each --size sets instead (the default size is {size!r}):\n{sizes}\n"
            f"\nVariants (--variant): {', '.join(VARIANTS)}"
            f"\nModel settings (GPTConfig fields; default: the size's shape, the variant's value fields, the data's "
            f"vocab_size): {', '.join(MODEL_KEYS)}")


if __name__ == "__main__":
    # loaded: Ctrl-C (and SIGTERM) stop the run through main()'s cleanup, in one line
    handle_signals({sig: stop_signal for sig in STOP_SIGNALS})
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        try:
            print(usage(), flush=True)
        except OSError as e:  # `--help | head` (the reader left: quiet, as argparse's scripts), or a full disk
            silence_stdout()
            sys.exit(0 if isinstance(e, BrokenPipeError) else f"error: cannot write the help to stdout: {e.strerror or e}")
        sys.exit(0)
    reconfigure_stdout(line_buffering=True)  # `python train.py | tee log` shows each line as it is logged
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:
        sig = RUN.get("signal", signal.SIGINT)
        if RUN.get("rank", 0) == 0:  # under torchrun, one line for the run, not one per rank
            print(f"{'terminated (SIGTERM)' if sig == signal.SIGTERM else 'interrupted'}; {stopped_note()}", file=sys.stderr)
        sys.exit(128 + sig)  # 130 after Ctrl-C, 143 after SIGTERM, as a shell reports them
    except BrokenPipeError:  # the reader of stdout left (`python train.py | head`): stop, like Ctrl-C, in one line
        silence_stdout()
        print(f"stopped: the reader of stdout left; {stopped_note()}", file=sys.stderr)
        sys.exit(1)
    except Exception as e:
        for sig in STOP_SIGNALS:  # torchrun's SIGTERM, after another rank's exit, must not cut this line short
            signal.signal(sig, signal.SIG_IGN)
        line = error_line(e, RUN.get("rank", 0), RUN.get("alike"))
        if line is None:  # not a stop but a bug: its traceback is the report
            raise
        if line:
            print(line, file=sys.stderr)
        sys.exit(1)
