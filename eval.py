"""
CORE: the 21 in-context tasks of DCLM that the paper reports (its Section 5, Tables 2 and 4).

    python eval.py --ckpt out/cpu_bov/ckpt.pt                    # all 21 tasks -> out/cpu_bov/core_eval.json
    python eval.py --ckpt out/cpu_bov/ckpt.pt --max_per_task 100 # a quick estimate
    python eval.py --ckpt out/cpu_bov/ckpt.pt --tasks arc_easy,squad --bundle ~/eval_bundle

Each task is a file of items in the DCLM eval bundle. A prompt is a few solved examples of the
same task (drawn with a seed from the task's other items), each followed by a blank line, then
the item itself; the tokens start with bos, and a prompt longer than the model's block_size is
cropped from the left, bos included (as nanochat crops; sample.py keeps bos). Three kinds of task,
three ways to score:
    multiple choice   {"query", "choices", "gold"}: the choice with the lowest loss per byte, the
                      summed loss of its scored tokens over those tokens' bytes
    schema            {"context_options", "continuation", "gold"}: the context under which the
                      shared continuation has the lowest loss per byte (its bytes are the same
                      under every context, so: the lowest summed loss)
    language modeling {"context", "continuation"}: right when the greedy (argmax) prediction
                      equals every token of the continuation
Centered accuracy is (acc - r) / (1 - r), with r the task's random baseline from the bundle;
CORE is the unweighted mean of the centered accuracies of the 21 tasks.

The bundle (nanochat's eval_bundle.zip, unzipped) is a folder holding
    eval_meta_data.csv    one row per task: "Eval Task" (the label) and "Random baseline" (in %)
    eval_data/<category>/<task>.jsonl   one JSON item per line (the paths are in TASKS below)
Without --bundle it is downloaded once into ~/.cache/bov/eval_bundle ($XDG_CACHE_HOME is
respected; BOV_EVAL_BUNDLE_URL replaces the URL, e.g. with a mirror).

--max_per_task N scores the first N items after a fixed shuffle (nanochat's); few-shot examples
always come from the whole task, so an item's prompt is the same in a subset as in a full run.
"""

import csv
import difflib
import glob
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections import namedtuple

# Ctrl-C while torch loads (a second or more): one line and exit 130, not a traceback (left ignored if it was, `cmd &`)
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    def _stopped_while_loading(*_):
        try:
            os.write(2, b"eval.py: interrupted\n")
        finally:  # exit 130 even with stderr closed (`2>&-`)
            os._exit(130)
    signal.signal(signal.SIGINT, _stopped_while_loading)

import torch
import torch.nn.functional as F
from tqdm import tqdm

from model import GPT, checkpoint_file, first_line, no_checkpoint, out_of_memory, unreadable_checkpoint
from prepare_data import (ArgumentParser, DataError, connection_text, handle_signals, is_http_url, json_lines, not_utf8,
                          reconfigure_stdout, silence_stdout, url_reachable, write_json)
from sample import autocast, check_device, checkpoint_tokenizer, float16_remedy, resolve_dtype

EVAL_BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"

# The 21 tasks as the paper's own code configures them (RiddleHe/nanochat, branch research/bank_of_values,
# configs/core.yaml; DCLM's core tasks): file in eval_data/, kind, number of few-shot examples, and the
# text between a question and its answer. Note ARC-Easy and ARC-Challenge 25-shot and Winogrande 5-shot
# there, where DCLM's low-variance config and current nanochat use 10, 10 and 0.
# A label is the task's "Eval Task" in eval_meta_data.csv (its random baseline). A task of an existing kind
# is one line here, plus its file under the bundle's eval_data/ and a row with its random baseline in
# eval_meta_data.csv (a copy of the bundle, given with --bundle); a new kind needs its FIELDS, item_problem,
# render, encode and its rule in evaluate_task. The bundle's own core.yaml (nanochat's) is not read: this is.
# CORE averages every task here: a 22nd line makes it no longer the paper's.
Task = namedtuple("Task", "path kind shots delimiter")
ANSWER = "\nAnswer: "
TASKS = {
    "jeopardy": Task("world_knowledge/jeopardy_all.jsonl", "lm", 10, ANSWER),
    "bigbench_qa_wikidata": Task("world_knowledge/bigbench_qa_wikidata.jsonl", "lm", 10, " "),
    "arc_easy": Task("world_knowledge/arc_easy.jsonl", "mc", 25, ANSWER),
    "arc_challenge": Task("world_knowledge/arc_challenge.jsonl", "mc", 25, ANSWER),
    "copa": Task("commonsense_reasoning/copa.jsonl", "mc", 0, " "),
    "commonsense_qa": Task("commonsense_reasoning/commonsense_qa.jsonl", "mc", 10, " "),
    "piqa": Task("commonsense_reasoning/piqa.jsonl", "mc", 10, ANSWER),
    "openbook_qa": Task("commonsense_reasoning/openbook_qa.jsonl", "mc", 0, " "),
    "lambada_openai": Task("language_understanding/lambada_openai.jsonl", "lm", 0, " "),
    "hellaswag": Task("language_understanding/hellaswag.jsonl", "mc", 10, " "),
    "winograd": Task("language_understanding/winograd_wsc.jsonl", "schema", 0, " "),
    "winogrande": Task("language_understanding/winogrande.jsonl", "schema", 5, " "),
    "bigbench_dyck_languages": Task("symbolic_problem_solving/bigbench_dyck_languages.jsonl", "lm", 10, " "),
    "agi_eval_lsat_ar": Task("symbolic_problem_solving/agi_eval_lsat_ar.jsonl", "mc", 3, " "),
    "bigbench_cs_algorithms": Task("symbolic_problem_solving/bigbench_cs_algorithms.jsonl", "lm", 10, " "),
    "bigbench_operators": Task("symbolic_problem_solving/bigbench_operators.jsonl", "lm", 10, " "),
    "bigbench_repeat_copy_logic": Task("symbolic_problem_solving/bigbench_repeat_copy_logic.jsonl", "lm", 10, " "),
    "squad": Task("reading_comprehension/squad.jsonl", "lm", 10, " "),
    "coqa": Task("reading_comprehension/coqa.jsonl", "lm", 0, " "),
    "boolq": Task("reading_comprehension/boolq.jsonl", "mc", 10, ANSWER),
    "bigbench_language_identification": Task("language_understanding/bigbench_language_identification.jsonl", "mc", 10, " "),
}
FIELDS = {"mc": ("query", "choices", "gold"), "schema": ("context_options", "continuation", "gold"),
          "lm": ("context", "continuation")}
SUBSET_SEED = 1337   # the shuffle that --max_per_task takes its first items from
FEWSHOT_SEED = 1234  # item i of the shuffled task draws its examples with Random(FEWSHOT_SEED + i)


class EvalError(Exception):
    """one-line, user-facing problem"""


# -----------------------------------------------------------------------------
# the bundle: a local folder, the cache, or a download into the cache

def cache_dir():
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bov", "eval_bundle")


def bundle_problem(path):
    """None if path is a bundle folder, else what is missing."""
    if not os.path.isdir(path):
        return f"no folder {path}"
    for name in ("eval_meta_data.csv", "eval_data"):
        if not os.path.exists(os.path.join(path, name)):
            return f"{path} has no {name}"
    return None


def get_bundle(path=None, flag="--bundle"):
    """The bundle folder: `path` (or its eval_bundle/ subfolder), else the cache, downloaded
    there first if need be (BOV_EVAL_BUNDLE_URL overrides the URL). `flag` is the option that
    names a bundle in the caller's messages (train.py's is --eval_bundle)."""
    if path is not None:
        for candidate in (path, os.path.join(path, "eval_bundle")):
            if not bundle_problem(candidate):
                return candidate
        raise EvalError(f"{flag}: {bundle_problem(path)}; expected an unzipped eval_bundle "
                        f"(eval_meta_data.csv and eval_data/)")
    dest = cache_dir()
    if not bundle_problem(dest):
        return dest
    if os.path.exists(dest):
        raise EvalError(f"{bundle_problem(dest)}; delete {dest} to download the bundle again")
    url = os.environ.get("BOV_EVAL_BUNDLE_URL", EVAL_BUNDLE_URL)
    if not is_http_url(url):
        raise EvalError(f"BOV_EVAL_BUNDLE_URL={url!r} is not an http(s) URL")
    download_bundle(url, dest, flag)
    return dest


def download_bundle(url, dest, flag):
    """Download the zip and unpack it into dest. Both steps happen beside dest and end in one
    rename, so dest is either the whole bundle or absent."""
    if not url_reachable(url, timeout=5.0):  # seconds to wait for a connection before calling the host unreachable
        raise EvalError(f"the CORE eval bundle is not in {dest} and {connection_text(url)} "
                        f"is unreachable; download {url} elsewhere, unzip it and pass {flag} path/to/eval_bundle")
    parent = os.path.dirname(dest)
    try:
        os.makedirs(parent, exist_ok=True)
        remove_dead_downloads(parent)
        work = tempfile.mkdtemp(prefix=f".eval_bundle.{os.getpid()}@{socket.gethostname()}.", dir=parent)
    except OSError as e:
        raise EvalError(f"cannot make the bundle cache {parent} ({e.strerror or e}); set XDG_CACHE_HOME to a writable "
                        f"folder, or unzip the bundle anywhere and pass {flag}") from None
    try:
        zpath = os.path.join(work, "eval_bundle.zip")
        try:
            with urllib.request.urlopen(url, timeout=30) as r, open(zpath, "wb") as f:
                total = int(r.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc="eval_bundle.zip") as bar:
                    while chunk := r.read(1 << 20):
                        f.write(chunk)
                        bar.update(len(chunk))
            with zipfile.ZipFile(zpath) as z:
                z.extractall(os.path.join(work, "x"))
        except (OSError, zipfile.BadZipFile, zlib.error, EOFError) as e:
            raise EvalError(f"could not download and unzip {url}: {e}") from None
        found = [d for d in (os.path.join(work, "x", "eval_bundle"), os.path.join(work, "x"))
                 if not bundle_problem(d)]
        if not found:
            raise EvalError(f"{url} does not hold an eval bundle (eval_meta_data.csv and eval_data/)")
        try:
            os.rename(found[0], dest)
        except OSError as e:  # fine if another process has just put a whole bundle there
            if bundle_problem(dest):
                raise EvalError(f"could not move the bundle to {dest}: {e}") from None
        print(f"eval bundle ready in {dest}", file=sys.stderr)  # stdout is the results table
    finally:
        shutil.rmtree(work, ignore_errors=True)


def remove_dead_downloads(parent):
    """Remove the work folders in parent of downloads by this machine's processes that are gone: killed with SIGKILL,
    or by a power cut, no `finally` removed them. A live process's, or another machine's (a shared home), stay."""
    host = socket.gethostname()
    for path in glob.glob(os.path.join(glob.escape(parent), f".eval_bundle.*@{glob.escape(host)}.*")):
        pid = os.path.basename(path)[len(".eval_bundle."):].split("@")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (PermissionError, OverflowError):  # another user's, alive; a pid no process can have
            pass


def load_baselines(bundle):
    """{task label: random baseline as a fraction} from eval_meta_data.csv."""
    path = os.path.join(bundle, "eval_meta_data.csv")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark is no column name
            baselines = {row["Eval Task"].strip(): float(row["Random baseline"]) / 100 for row in csv.DictReader(f)}
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise EvalError(f"{path} is unreadable ({type(e).__name__}: {e}); it needs the columns "
                        f"'Eval Task' and 'Random baseline'") from None
    bad = next((t for t, r in baselines.items() if not 0 <= r < 1), None)  # centered accuracy divides by 1 - r
    if bad is not None:
        raise EvalError(f"{path}: the random baseline of {bad} is {100 * baselines[bad]:g}%, not in [0, 100)")
    return baselines


def item_problem(kind, item):
    """None if item has the fields of its kind, with the right types, else what is wrong."""
    if not isinstance(item, dict) or any(k not in item for k in FIELDS[kind]):
        return f"a {kind} item needs the fields {', '.join(FIELDS[kind])}"
    texts = {k: item[k] for k in ("query", "context", "continuation") if k in FIELDS[kind]}
    options = item.get("choices" if kind == "mc" else "context_options", [])
    if not all(isinstance(v, str) for v in texts.values()) or not isinstance(options, list) \
            or not all(isinstance(o, str) for o in options):
        return f"the fields {', '.join(FIELDS[kind])} must be text (options a list of text)"
    if kind == "lm" and not item["continuation"].strip():  # nothing to predict: an empty span would score right
        return "an lm item needs a continuation to predict, not an empty one"
    gold = item.get("gold")
    if kind != "lm" and not (isinstance(gold, int) and not isinstance(gold, bool) and 0 <= gold < len(options)):
        return f"gold {gold!r} is not an index into its {len(options)} options"
    return None


def load_task(bundle, label):
    """The task's items, checked for the fields its kind needs."""
    task = TASKS[label]
    path = os.path.join(bundle, "eval_data", task.path)
    items = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, item in json_lines(f, path, EvalError):
                problem = item_problem(task.kind, item)
                if problem:
                    raise EvalError(f"{path}:{n}: {problem}")
                items.append(item)
    except OSError as e:
        raise EvalError(f"cannot read task {label}: {e}") from None
    except UnicodeDecodeError as e:
        raise EvalError(not_utf8(path, e)) from None
    if not items:
        raise EvalError(f"{path} holds no items")
    return items


def check_tasks(tasks):
    """The task labels as a list (None: all 21); EvalError for an unknown one."""
    tasks = list(TASKS) if tasks is None else list(dict.fromkeys(tasks))  # each task once, in the order given
    if not tasks:
        raise EvalError(f"--tasks names no task; the tasks are {', '.join(TASKS)} (leave --tasks out for all)")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        near = {t: difflib.get_close_matches(t, TASKS, n=1, cutoff=0.7) for t in unknown}
        named = ", ".join(t + (f" (did you mean {near[t][0]}?)" if near[t] else "") for t in unknown)
        raise EvalError(f"unknown task(s) {named}; the tasks are {', '.join(TASKS)}")
    return tasks


def load_bundle(bundle_dir=None, tasks=None, flag="--bundle"):
    """(bundle folder, task labels, {label: random baseline}, {label: items}), every task file read and
    checked: what evaluate_core needs, and what train.py --core_eval checks before it trains."""
    tasks = check_tasks(tasks)
    bundle = get_bundle(bundle_dir, flag)
    baselines = load_baselines(bundle)
    missing = [t for t in tasks if t not in baselines]
    if missing:
        raise EvalError(f"{bundle}/eval_meta_data.csv has no random baseline for {', '.join(missing)}")
    missing = [TASKS[t].path for t in tasks if not os.path.isfile(os.path.join(bundle, "eval_data", TASKS[t].path))]
    if missing:  # before hours of work, not after
        raise EvalError(f"{bundle}/eval_data lacks {', '.join(missing)}")
    return bundle, tasks, baselines, {label: load_task(bundle, label) for label in tasks}


# -----------------------------------------------------------------------------
# prompts

def fewshot_indices(n, i, k):
    """k distinct indices of [0, n) other than i, drawn with Random(FEWSHOT_SEED + i). The same draw as
    sampling from the list of all the other indices, without building that list."""
    rng = random.Random(FEWSHOT_SEED + i)
    return [j + (j >= i) for j in rng.sample(range(n - 1), min(k, n - 1))]


def render(task, item, shots):
    """The prompt texts of an item after its few-shot examples: one per choice (mc), one per
    context option (schema), or the prompt without and with the continuation (lm)."""
    d = task.delimiter
    if task.kind == "mc":
        head = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}\n\n" for s in shots)
        return [f"{head}{item['query']}{d}{c}" for c in item["choices"]]
    if task.kind == "schema":
        head = "".join(f"{s['context_options'][s['gold']]}{d}{s['continuation']}\n\n" for s in shots)
        return [f"{head}{c}{d}{item['continuation']}" for c in item["context_options"]]
    head = "".join(f"{s['context'].strip()}{d}{s['continuation']}\n\n" for s in shots)
    prompt = f"{head}{item['context'].strip()}{d}"
    # stripped, so trailing spaces join the continuation's first token as they do in the full text
    return [prompt.strip(), f"{prompt}{item['continuation']}"]


def common_length(seqs, from_end=False):
    """Length of the prefix (or suffix) that all the sequences share."""
    n = min(len(s) for s in seqs)
    for k in range(n):
        if len({s[-1 - k] if from_end else s[k] for s in seqs}) > 1:
            return k
    return n


def encode(task, prompts, tokenizer, max_len):
    """[(tokens, start, end)] with tokens[start:end] the part of each prompt that is scored:
    after the choices' shared prefix (mc), the options' shared suffix (schema), or after the
    prompt without the continuation (lm). Every sequence starts with bos and is cropped from
    the left to max_len tokens."""
    toks = [[tokenizer.bos_id] + tokenizer.encode(p) for p in prompts]
    if task.kind == "mc":
        start = min(common_length(toks), min(len(t) for t in toks) - 1)  # at least one scored token
        spans = [(t, start, len(t)) for t in toks]
    elif task.kind == "schema":
        n = min(common_length(toks, from_end=True), min(len(t) for t in toks) - 1)
        spans = [(t, len(t) - n, len(t)) for t in toks]
    else:
        full = toks[1]
        start = min(common_length(toks), len(full) - 1)
        spans = [(full, start, len(full))]
    out = []
    for t, s, e in spans:
        cut = max(0, len(t) - max_len)
        out.append((t[cut:], max(1, s - cut), e - cut))  # position 0 has no prediction of its own
    return out


# -----------------------------------------------------------------------------
# scoring

@torch.no_grad()
def score(model, rows, batch_size, device, pad_id, dtype=torch.float32, bar=None):
    """For rows [(tokens, start, end)]: the summed loss of tokens[start:end] given what precedes
    them, and whether the argmax prediction equals all of them. Batches rows of similar length,
    padded on the right (a causal model never sees the padding); the forward runs under --dtype's autocast."""
    losses, right = [0.0] * len(rows), [False] * len(rows)
    order = sorted(range(len(rows)), key=lambda r: -len(rows[r][0]))
    for b in range(0, len(order), batch_size):
        chunk = order[b:b + batch_size]
        T = len(rows[chunk[0]][0])
        idx = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        scored = torch.zeros(len(chunk), T - 1, dtype=torch.bool)  # position p predicts token p + 1
        for j, r in enumerate(chunk):
            t, s, e = rows[r]
            idx[j, :len(t)] = torch.tensor(t)
            scored[j, s - 1:e - 1] = True
        idx, scored = idx.to(device), scored.to(device)
        with autocast(device, dtype):
            logits, _ = model(idx)
        logits = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32, fp64 stays
        if not torch.isfinite(logits).all():  # every score would be wrong, and the accuracy with it, silently
            raise EvalError(f"the model's logits are not finite (NaN or inf) under {str(dtype).removeprefix('torch.')}"
                            f"{float16_remedy(dtype, 'evaluate')}")
        targets = idx[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none").view_as(targets)
        summed = (loss * scored).sum(1)
        ok = ((logits.argmax(-1) == targets) | ~scored).all(1)
        summed, ok = summed.tolist(), ok.tolist()  # one device -> host copy each per batch, not two per row
        for j, r in enumerate(chunk):
            losses[r], right[r] = summed[j], bool(ok[j])
        if bar is not None:
            bar.update(len(chunk))
    return losses, right


def per_byte(loss, row, tokenizer):
    """Summed loss over the UTF-8 bytes of the scored tokens (at least 1), as the paper's code
    (RiddleHe/nanochat, research/bank_of_values, nanochat/core_eval.py) ranks multiple-choice and
    schema options: lm-eval-harness's acc_norm. Upstream nanochat ranks by mean loss per token,
    which favours options split into more, easier tokens."""
    tokens, start, end = row
    # the tokens' own bytes, not their decoded text: a span that begins inside a character decodes to U+FFFD (3 bytes)
    return loss / max(1, len(tokenizer.decode_bytes(tokens[start:end])))


def evaluate_task(model, tokenizer, label, data, n=None, device="cpu", batch_size=16, bar=None, dtype=torch.float32):
    """Accuracy on the first n items of data (all by default); the few-shot examples of item i
    come from all of data but item i."""
    task = TASKS[label]
    n = len(data) if n is None else min(n, len(data))
    rows, first = [], []  # rows of item i: rows[first[i]:first[i + 1]]
    for i in range(n):
        shots = [data[j] for j in fewshot_indices(len(data), i, task.shots)]
        first.append(len(rows))
        rows += encode(task, render(task, data[i], shots), tokenizer, model.config.block_size)
    first.append(len(rows))
    if bar is not None:
        bar.reset(total=len(rows))
        bar.set_description(label)
    losses, right = score(model, rows, batch_size, device, tokenizer.bos_id, dtype, bar)
    correct = 0
    for i in range(n):
        a, b = first[i], first[i + 1]
        if task.kind == "lm":  # one row: right when every continuation token is the argmax
            correct += right[a]
        else:  # one row per option: the lowest loss per byte wins, the first one on a tie
            option_losses = [per_byte(losses[r], rows[r], tokenizer) for r in range(a, b)]
            correct += option_losses.index(min(option_losses)) == data[i]["gold"]
    return correct / n


def evaluate_core(model, tokenizer, bundle_dir=None, tasks=None, max_per_task=None, device=None, batch_size=16, loaded=None,
                  dtype=None):
    """Evaluate model (called as model(idx) -> (logits, _), with model.config.block_size) on the
    CORE tasks (all 21 by default) of the bundle (None: the cached or downloaded one), or on
    `loaded`, what load_bundle returned (train.py reads the bundle before training, and only then).
    max_per_task evaluates the first N items of each task after a fixed shuffle. dtype is the autocast
    dtype (None: bfloat16 on CUDA from Ampere on, float16 before, float32 elsewhere, as --dtype auto). Returns
    {"core", "tasks": {label: {"accuracy", "centered", "random_baseline", "items", "shots", "kind"}},
     "max_per_task", "bundle"}; core is the mean centered accuracy of the tasks evaluated."""
    if max_per_task is not None and max_per_task < 1:
        raise EvalError(f"max_per_task must be at least 1, got {max_per_task}")
    if loaded and (bundle_dir is not None or tasks is not None):
        raise ValueError("loaded already holds the bundle and its tasks: pass bundle_dir and tasks to load_bundle")
    bundle, tasks, baselines, items = loaded or load_bundle(bundle_dir, tasks)
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if dtype is None:
        dtype = resolve_dtype("auto", device)
    was_training = model.training
    model.eval()
    results = {}
    try:
        with tqdm(desc="CORE", unit="seq", leave=False) as bar:
            for label in tasks:
                t0 = time.time()
                data = list(items[label])  # shuffled here, the loaded order kept for another call
                random.Random(SUBSET_SEED).shuffle(data)
                acc = evaluate_task(model, tokenizer, label, data, max_per_task, device, batch_size, bar, dtype)
                r = baselines[label]
                results[label] = dict(accuracy=acc, centered=(acc - r) / (1 - r), random_baseline=r,
                                      items=min(len(data), max_per_task or len(data)),
                                      shots=min(TASKS[label].shots, len(data) - 1), kind=TASKS[label].kind)  # as drawn
                bar.write(f"{label:<33} accuracy {acc:.4f}  centered {results[label]['centered']:+.4f}  "
                          f"({results[label]['items']} items, {time.time() - t0:.1f}s)", file=sys.stderr)  # progress
    finally:
        model.train(was_training)
    core = sum(v["centered"] for v in results.values()) / len(results)
    return {"core": core, "tasks": results, "max_per_task": max_per_task, "bundle": os.path.abspath(bundle)}


def format_table(result):
    """The per-task results and CORE as a text table."""
    lines = [f"{'task':<33} {'kind':<7} {'shots':>5} {'items':>6} {'random':>7} {'accuracy':>9} {'centered':>9}"]
    for label, v in result["tasks"].items():
        lines.append(f"{label:<33} {v['kind']:<7} {v['shots']:>5} {v['items']:>6} {v['random_baseline']:>7.3f} "
                     f"{v['accuracy']:>9.4f} {v['centered']:>+9.4f}")
    n = len(result["tasks"])
    name = "CORE" if n == len(TASKS) else f"CORE ({n} of {len(TASKS)} tasks)"
    if result["max_per_task"]:
        name += f", at most {result['max_per_task']} items per task"
    lines.append(f"{name:<72} {result['core']:>+9.4f}")
    return "\n".join(lines)


def results_file(path):
    """Whether path holds what main() writes (a JSON object with the CORE score, its tasks and its checkpoint)."""
    try:
        with open(path, encoding="utf-8") as f:
            r = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(r, dict) and {"core", "tasks", "ckpt"} <= r.keys()


def main(argv=None):
    p = ArgumentParser(prog="eval.py", description="Evaluate a checkpoint on CORE (21 DCLM tasks); writes "
                       "core_eval.json beside it (core_eval_partial.json for --tasks or --max_per_task, so a "
                       "quick check never replaces a full result).")
    p.add_argument("--ckpt", required=True, help="checkpoint written by train.py, or its run folder")
    p.add_argument("--tasks", help=f"comma-separated subset of: {', '.join(TASKS)} (default: all)")
    p.add_argument("--max_per_task", type=int, help="evaluate at most N items of each task, the first N after a fixed "
                   "shuffle (seed 1337, as nanochat) (default: all)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda | cuda:N | mps")
    p.add_argument("--data_dir", help="prepared-data folder whose tokenizer to use (default: the folder the checkpoint "
                   "was trained on, recorded in it; its tokenizer's SHA-256 is checked either way)")
    p.add_argument("--bundle", help="unzipped eval_bundle folder (default: ~/.cache/bov/eval_bundle, downloaded once)")
    p.add_argument("--batch_size", type=int, default=16, help="sequences per forward pass (default 16)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="autocast dtype; auto = bfloat16 on CUDA from Ampere (compute capability 8) on, "
                        "float16 before, float32 elsewhere")
    p.add_argument("--out", help="the results file (default: core_eval.json, or core_eval_partial.json, beside the "
                   "checkpoint); for a checkpoint in a folder you cannot write to")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error("--batch_size must be at least 1")
    if args.max_per_task is not None and args.max_per_task < 1:
        p.error(f"--max_per_task must be at least 1, got {args.max_per_task}")
    try:  # Ctrl-C in the checks too (a checkpoint's CRCs take seconds at 780M): one line
        args.ckpt = checkpoint_file(args.ckpt)  # a run's folder: its ckpt.pt
        if not os.path.isfile(args.ckpt):  # before the bundle, which may be a download
            sys.exit(f"eval.py: error: {no_checkpoint(args.ckpt)}")
        problem = unreadable_checkpoint(args.ckpt, crc=False)  # a truncated copy, before the bundle too (the CRCs: at the load)
        if problem:
            sys.exit(f"eval.py: error: {problem}")
        partial = args.tasks is not None or args.max_per_task is not None
        if args.out is not None and (not args.out or (os.path.exists(args.out) and os.path.samefile(args.out, args.ckpt))):
            p.error(f"--out {args.out!r} is " + ("empty" if not args.out else "the checkpoint itself") + "; name a results file")
        out = os.path.abspath(args.out) if args.out else \
            os.path.join(os.path.dirname(os.path.abspath(args.ckpt)), "core_eval_partial.json" if partial else "core_eval.json")
        folder = os.path.dirname(out)
        why = ("it is a folder" if os.path.isdir(out) else f"there is no folder {folder}" if not os.path.isdir(folder)
               else f"{folder} is not writable" if not os.access(folder, os.W_OK) else None)
        if why:  # before the evaluation
            p.error(f"cannot write the results to {out}: {why}" + ("" if args.out else "; choose another file with --out"))
        if os.path.lexists(out) and (os.path.islink(out) or not os.path.isfile(out)):  # written by a rename: never replaced
            p.error(f"{out} is not a regular file (a link, a device, a pipe): the results replace their file whole; "
                    "name another file" + ("" if args.out else " with --out"))
        if args.out and os.path.isfile(out) and not results_file(out):  # a metrics log, a tokenizer: never overwritten
            p.error(f"--out {args.out} exists and holds no eval.py results; remove it or name another file")
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks is not None else None
        check_tasks(tasks)
        check_device(args.device)
        loaded = load_bundle(args.bundle, tasks)  # every task file read before the model: fail fast on bad data
        model, ckpt = GPT.from_checkpoint(args.ckpt, args.device)
        tokenizer = checkpoint_tokenizer(args.ckpt, ckpt, model.config.vocab_size, args.data_dir)
        result = evaluate_core(model, tokenizer, max_per_task=args.max_per_task, device=args.device,
                               batch_size=args.batch_size, loaded=loaded, dtype=resolve_dtype(args.dtype, args.device))
    except (EvalError, DataError, OSError, ValueError, RuntimeError, MemoryError) as e:
        if out_of_memory(e):  # on the GPU or the host
            sys.exit(f"eval.py: error: out of memory on {args.device}; lower --batch_size (now {args.batch_size})")
        sys.exit(f"eval.py: error: {first_line(e, None)}")
    except KeyboardInterrupt:
        print("eval.py: interrupted", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT, as a shell reports Ctrl-C
    result["ckpt"], result["step"] = os.path.abspath(args.ckpt), ckpt.get("step")  # which save of its run (None: not train.py's)
    table = format_table(result)
    try:  # the file first: a closed or full stdout must not lose the evaluation
        write_json(out, result, f"{out}.tmp{os.getpid()}")  # per process: two runs on one checkpoint never share it
    except OSError as e:
        print(table)
        sys.exit(f"eval.py: error: cannot write {out}: {e.strerror or e}")
    try:
        print(table)
        print(f"wrote {out}", flush=True)
    except OSError as e:
        silence_stdout()
        sys.exit(f"eval.py: could not print the table ({e.strerror or e}); the results are in {out}")


if __name__ == "__main__":
    handle_signals({signal.SIGINT: signal.default_int_handler,  # loaded: Ctrl-C is a KeyboardInterrupt again
                    signal.SIGTERM: lambda *_: sys.exit(143)})  # SystemExit: finally blocks (the download's cleanup) run
    reconfigure_stdout()
    main()
