"""Tests for eval.py: the scoring of each task kind against a model whose losses are known, CORE by hand,
few-shot draws, prompts and cropping, the bundle download, and main() end to end on a tiny checkpoint."""
import csv
import io
import json
import math
import os
import random
import shutil
import urllib.error
import urllib.request
import zipfile
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import eval as ev
from conftest import BYTE_TOKENIZER
from model import load_tokenizer

ENC = load_tokenizer(BYTE_TOKENIZER)  # one token per byte; <|bos|> = 256
L = 10.0
GOOD = math.log(1 + 256 * math.exp(-L))  # the loss of the expected byte: logit L against 256 zeros
BAD = GOOD + L                            # the loss of any other byte


class Bigram(torch.nn.Module):
    """GPT's forward signature, predicting from the last byte alone with logit L on one byte: the next
    letter after a-y, 'a' after a space, a space after anything else. A span's loss is GOOD per expected byte,
    BAD per other one, and greedy decoding gives it when every byte is the expected one."""

    def __init__(self, block_size=1000):
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size)
        self.nxt = torch.full((257,), ord(" "))
        self.nxt[ord("a"):ord("z")] = torch.arange(ord("b"), ord("z") + 1)
        self.nxt[ord(" ")] = ord("a")
        self.widths = []  # the width of every batch it saw

    def forward(self, idx, targets=None, cache=None):
        assert idx.size(1) <= self.config.block_size
        self.widths.append(idx.size(1))
        return L * F.one_hot(self.nxt[idx], 257).float(), None


# Items of each kind, scored under Bigram by hand: (item, right?). The delimiter is a space.
MC = [  # per byte "bcdefghi" (BAD + 7 GOOD) / 8 beats "az" (GOOD + BAD) / 2, which has the lower sum
    ({"query": "q1", "choices": ["bcdefghi", "az"], "gold": 0}, True),
    ({"query": "q2", "choices": ["abc", "abx", "x"], "gold": 1}, False),  # "abc" wins
    ({"query": "q3", "choices": ["zz", "zz"], "gold": 1}, False),  # a tie goes to the first
    ({"query": "q4", "choices": ["ax", "abcd"], "gold": 1}, True),  # the shared "a" is not scored
]
SCHEMA = [  # the scored span " ab" starts with the space, which only 'z', '.' or '!' predicts
    ({"context_options": ["the cat z", "the dog m"], "continuation": "ab", "gold": 0}, True),
    ({"context_options": ["one.", "two c", "six b"], "continuation": "abc", "gold": 2}, False),
    ({"context_options": ["it was q", "it was!"], "continuation": "a", "gold": 1}, True),
]
LM = [  # the delimiter's space is scored with the continuation
    ({"context": "it is z", "continuation": "abc"}, True),
    ({"context": " it is z  ", "continuation": "abd"}, False),  # the context is stripped; 'd' is not 'c'
    ({"context": "it is y", "continuation": "abc"}, False),  # after 'y' the model expects 'z', not the space
    ({"context": "the end.", "continuation": "a"}, True),
]
ITEMS = {"mc": [it for it, _ in MC], "schema": [it for it, _ in SCHEMA], "lm": [it for it, _ in LM]}
BASELINE = {"mc": 20.0, "schema": 50.0, "lm": 0.0}  # random baselines, in % as eval_meta_data.csv has them


def write_bundle(root, labels):
    """The eval_bundle layout in root/eval_bundle, each task holding the items of its kind."""
    bundle = root / "eval_bundle"
    for label in labels:
        path = bundle / "eval_data" / (ev.TASKS[label].path + ".jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(it) + "\n" for it in ITEMS[ev.TASKS[label].kind]))
    with open(bundle / "eval_meta_data.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Eval Task", "Task Category", "Task Type", "#shots", "Random baseline", "Description"])
        for label in labels:
            w.writerow([label, "a category", "a type", 0, BASELINE[ev.TASKS[label].kind], "text, a comma"])
    return bundle


def test_the_21_tasks_of_the_paper():
    assert {t: (task.kind, task.shots) for t, task in ev.TASKS.items()} == {
        "jeopardy": ("lm", 10), "bigbench_qa_wikidata": ("lm", 10), "arc_easy": ("mc", 25),
        "arc_challenge": ("mc", 25), "copa": ("mc", 0), "commonsense_qa": ("mc", 10), "piqa": ("mc", 10),
        "openbook_qa": ("mc", 0), "lambada_openai": ("lm", 0), "hellaswag": ("mc", 10),
        "winograd": ("schema", 0), "winogrande": ("schema", 5), "bigbench_dyck_languages": ("lm", 10),
        "agi_eval_lsat_ar": ("mc", 3), "bigbench_cs_algorithms": ("lm", 10), "bigbench_operators": ("lm", 10),
        "bigbench_repeat_copy_logic": ("lm", 10), "squad": ("lm", 10), "coqa": ("lm", 0), "boolq": ("mc", 10),
        "bigbench_language_identification": ("mc", 10)}
    assert {t for t, task in ev.TASKS.items() if task.delimiter != " "} == \
        {"jeopardy", "arc_easy", "arc_challenge", "piqa", "boolq"}


@pytest.mark.parametrize("label, shot, item, texts", [
    ("arc_easy", {"query": "Q1", "choices": ["no", "yes"], "gold": 1}, {"query": "Q2", "choices": ["a", "b"]},
     ["Q1\nAnswer: yes\n\nQ2\nAnswer: a", "Q1\nAnswer: yes\n\nQ2\nAnswer: b"]),
    ("winogrande", {"context_options": ["A1", "B1"], "continuation": "c1", "gold": 1},
     {"context_options": ["A2", "B2"], "continuation": "c2"}, ["B1 c1\n\nA2 c2", "B1 c1\n\nB2 c2"]),
    ("jeopardy", {"context": "  Q1 ", "continuation": "a1"}, {"context": "Q2  ", "continuation": "a2"},
     ["Q1\nAnswer: a1\n\nQ2\nAnswer:", "Q1\nAnswer: a1\n\nQ2\nAnswer: a2"]),
])
def test_render_puts_solved_examples_before_the_item(label, shot, item, texts):
    assert ev.render(ev.TASKS[label], item, [shot]) == texts


@pytest.mark.parametrize("n, k", [(4, 10), (30, 25), (200, 3)])
def test_fewshot_draws_are_seeded_distinct_and_never_the_item(n, k):
    for i in range(n):
        d = ev.fewshot(n, i, k)
        assert i not in d and len(set(d)) == len(d) == min(k, n - 1) and all(0 <= j < n for j in d)
        # nanochat's draw, from the list of the other items
        assert d == random.Random(1234 + i).sample([j for j in range(n) if j != i], min(k, n - 1))


@pytest.mark.parametrize("block_size, tokens, start", [
    (20, list(range(10)), 6), (10, list(range(10)), 6), (8, list(range(2, 10)), 4),
    (3, list(range(7, 10)), 1),  # the cut reaches the scored tokens: all but the first are scored
])
def test_crop_keeps_the_last_block_size_tokens(block_size, tokens, start):
    assert ev.crop(list(range(10)), 6, block_size) == (tokens, start)


@pytest.mark.parametrize("label, item, losses, greedy", [
    ("copa", MC[0][0], [BAD + 7 * GOOD, GOOD + BAD], [False, False]),
    ("copa", MC[3][0], [BAD, 3 * GOOD], [False, True]),
    ("winograd", SCHEMA[0][0], [3 * GOOD, BAD + 2 * GOOD], [True, False]),
    ("lambada_openai", LM[0][0], [4 * GOOD], [True]),
    ("lambada_openai", LM[1][0], [3 * GOOD + BAD], [False]),
])
def test_score_sums_the_loss_of_the_scored_span(label, item, losses, greedy):
    task = ev.TASKS[label]
    rows = ev.encode(task.kind, ev.render(task, item, []), ENC, 1000)
    assert all(t[0] == 256 for t, _ in rows)  # every prompt starts with <|bos|>
    got_losses, got_greedy = ev.score(Bigram(), rows, batch_size=1)
    assert got_losses == pytest.approx(losses, abs=1e-4) and got_greedy == greedy  # float32


@pytest.mark.parametrize("shots, block_size, batch_size", [(False, 1000, 16), (True, 1000, 1), (True, 12, 3)])
def test_core_of_each_kind_by_hand(tmp_path, shots, block_size, batch_size):
    """Bigram scores every item's span the same after any examples and any crop that keeps the span and the
    byte before it, so the accuracies are the shares of right items above: 2/4, 2/3 and 2/4."""
    labels = ["hellaswag", "winogrande", "squad"] if shots else ["copa", "winograd", "lambada_openai"]
    model = Bigram(block_size)
    res = ev.evaluate_core(model, ENC, write_bundle(tmp_path, labels), labels, batch_size=batch_size)
    expected = {"mc": (2 / 4, 0.2, (0.5 - 0.2) / 0.8), "schema": (2 / 3, 0.5, (2 / 3 - 0.5) / 0.5),
                "lm": (2 / 4, 0.0, 0.5)}
    assert [sum(r for _, r in items) / len(items) for items in (MC, SCHEMA, LM)] == [2 / 4, 2 / 3, 2 / 4]
    for label in labels:
        t, (acc, r, centered) = res["tasks"][label], expected[ev.TASKS[label].kind]
        assert (t["accuracy"], t["random_baseline"], t["centered"]) == pytest.approx((acc, r, centered))
        assert t["items"] == len(ITEMS[t["kind"]]) and t["shots"] == (t["items"] - 1 if shots else 0)
    assert res["core"] == pytest.approx((0.375 + 1 / 3 + 0.5) / 3)
    if block_size < 13:  # the longest prompt has 13 tokens without examples
        assert max(model.widths) == block_size  # Bigram asserts no more


@pytest.mark.parametrize("n", [1, 2, 3])
def test_max_per_task_scores_the_first_items_of_nanochats_shuffle(tmp_path, n):
    right = [r for _, r in MC]
    random.Random(1337).shuffle(right)
    res = ev.evaluate_core(Bigram(), ENC, write_bundle(tmp_path, ["copa"]), ["copa"], max_per_task=n)
    assert res["tasks"]["copa"]["items"] == n and res["tasks"]["copa"]["accuracy"] == sum(right[:n]) / n


@pytest.mark.parametrize("error", [urllib.error.URLError("[Errno -3] Temporary failure in name resolution"),
                                   TimeoutError("timed out")])
def test_no_host_is_one_line_that_says_how_to_run_offline(tmp_path, monkeypatch, error):
    def urlopen(*args, **kwargs):
        raise error
    monkeypatch.setattr(ev, "CACHE", str(tmp_path / "cache" / "eval_bundle"))
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(SystemExit) as e:
        ev.get_bundle()
    reason = getattr(error, "reason", error)
    assert str(e.value) == (f"eval.py: cannot reach {ev.BUNDLE_URL} ({reason}); to run offline, download "
                            "and unzip it elsewhere and pass --bundle path/to/eval_bundle")
    assert not (tmp_path / "cache").exists()


def test_the_bundle_is_downloaded_once_into_the_cache(tmp_path, monkeypatch):
    src = write_bundle(tmp_path / "src", ["copa"])
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as z:  # the zip holds the folder eval_bundle
        for path in src.rglob("*"):
            z.write(path, path.relative_to(src.parent))
    zipped = data.getvalue()
    urls = []

    def urlopen(url, timeout):
        urls.append(url)
        return io.BytesIO(zipped)
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    cache = tmp_path / "cache" / "eval_bundle"
    monkeypatch.setattr(ev, "CACHE", str(cache))
    assert ev.get_bundle(str(src)) == str(src) and urls == []
    assert ev.get_bundle() == ev.get_bundle() == str(cache) and urls == [ev.BUNDLE_URL]
    assert os.listdir(cache.parent) == ["eval_bundle"]  # no temporary folder left
    assert ev.load_task(str(cache), "copa") == ITEMS["mc"] and ev.load_baselines(str(cache)) == {"copa": 0.2}


@pytest.mark.parametrize("extra, name", [([], "core_eval.json"),
                                         (["--max_per_task", "2"], "core_eval_partial.json"),
                                         (["--tasks", "copa,squad"], "core_eval_partial.json")])
@pytest.mark.parametrize("ckpt", ["out_dir", "ckpt.pt"])
def test_main_writes_the_results_beside_the_checkpoint(tmp_path, checkpoint, capsys, extra, name, ckpt):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(checkpoint / "ckpt.pt", out / "ckpt.pt")
    bundle = write_bundle(tmp_path, list(ev.TASKS))
    result = ev.main(["--ckpt", str(out if ckpt == "out_dir" else out / "ckpt.pt"), "--bundle", str(bundle),
                      "--batch_size", "5", *extra])
    assert sorted(os.listdir(out)) == sorted(["ckpt.pt", name])  # a partial run never replaces a full result
    saved = json.loads((out / name).read_text())
    assert saved == result and saved["step"] == 0 and saved["bundle"] == str(bundle)
    tasks = saved["tasks"]
    assert list(tasks) == (["copa", "squad"] if "--tasks" in extra else list(ev.TASKS))
    for label, t in tasks.items():
        n = len(ITEMS[ev.TASKS[label].kind])
        assert t["items"] == (2 if "--max_per_task" in extra else n)
        r = t["random_baseline"]
        assert r == BASELINE[t["kind"]] / 100
        assert t["centered"] == pytest.approx((t["accuracy"] - r) / (1 - r))
    assert saved["core"] == pytest.approx(sum(t["centered"] for t in tasks.values()) / len(tasks))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:-2]] == list(tasks)
    assert lines[-2:] == [f"CORE {saved['core']:.4f} ({len(tasks)} tasks)", f"wrote {out / name}"]
