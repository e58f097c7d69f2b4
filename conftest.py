"""pytest setup for every test file: one CPU thread per process. The tests use tiny models, where a
second thread buys nothing, while two processes that each spin two OpenMP threads on two cores (a
test and the train.py it starts, the two test workers of `pytest -n 2`, or a neighbouring job) slow each other
down many times over."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the scripts the tests start

import torch  # noqa: E402

torch.set_num_threads(1)

import signal  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import zipfile  # noqa: E402

import pytest  # noqa: E402

# The tests send Ctrl-Cs, in-process and to the scripts they start, and expect them handled as in a terminal. A pytest
# started with SIGINT ignored (`pytest &` in a script, some CI runners) would pass that on to both, and the scripts
# leave an ignored SIGINT ignored, as Python itself does (prepare_data.handle_signals): handle it here.
signal.signal(signal.SIGINT, signal.default_int_handler)


def builds(size, variant, **overrides):
    """Whether the size has the variant's target layers (a researcher's variant may list indices past its depth:
    README "A new variant"). Any other refusal of the variant is raised, so that a mistake in it fails the tests
    rather than skipping them."""
    from model import GPTConfig, SIZES, VARIANTS
    if size in SIZES and variant in VARIANTS:  # else preset() below says what is unknown
        layers = GPTConfig.layer_spec({**VARIANTS[variant], **overrides}.get("bov_layers"))  # "8,9", 8, [8, 9]: a tuple
        depth = overrides.get("n_layer", SIZES[size]["n_layer"])
        if isinstance(layers, tuple) and any(isinstance(i, int) and i >= depth for i in layers):
            return False
    GPTConfig.preset(size, variant, **overrides)
    return True


def first_gradient_spy(path):
    """A GPT.configure_optimizers whose first optimizer step saves the gradient it is given (every parameter's,
    flattened, in order) to path.RANK (0 without torchrun) before it steps: the step's whole gradient, after
    accumulation and DDP's averaging."""
    from model import GPT
    configure = GPT.configure_optimizers

    def spy(self, *a, **k):
        opts = configure(self, *a, **k)
        step = opts[0].step

        def recording(*x, **y):
            out = f"{path}.{os.environ.get('RANK', 0)}"
            if not os.path.exists(out):
                torch.save(torch.cat([p.grad.flatten() for p in self.parameters() if p.grad is not None]), out)
            return step(*x, **y)
        opts[0].step = recording
        return opts
    return spy


def finish(p, timeout=300):
    """The CompletedProcess of a Popen started with text pipes; past timeout it is killed and the test fails."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(f"{subprocess.list2cmdline(map(str, p.args))[:200]} did not finish in {timeout} s")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def flip_tensor_byte(path):
    """Flip one bit in the middle of the largest record of the torch.save zip at path (a tensor's bytes),
    as a bad disk or copy would; the zip's structure stays whole."""
    data = bytearray(path.read_bytes())
    record = max(zipfile.ZipFile(path).infolist(), key=lambda r: r.file_size)
    name_len, extra_len = struct.unpack("<HH", data[record.header_offset + 26:record.header_offset + 30])  # local header
    data[record.header_offset + 30 + name_len + extra_len + record.file_size // 2] ^= 1
    path.write_bytes(bytes(data))
    return record.filename


def set_compression_method(path, method):
    """Write `method` into the central-directory entry of the largest record of the torch.save zip at path
    (torch stores, method 0, and ignores the field; zipfile reads by it)."""
    data = bytearray(path.read_bytes())
    archive = zipfile.ZipFile(path)
    records = archive.infolist()
    largest = max(records, key=lambda r: r.file_size)
    pos = archive.start_dir
    for r in records[:records.index(largest)]:  # each entry: 46 bytes, then its name, extra field and comment
        pos += 46 + sum(struct.unpack("<HHH", data[pos + 28:pos + 34]))
    data[pos + 10:pos + 12] = struct.pack("<H", method)
    path.write_bytes(bytes(data))


@pytest.fixture(autouse=True)
def kill_leftover_processes(monkeypatch):
    """A test that starts a script early and fails a check before collecting it leaves nothing running."""
    started = []

    class Tracked(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append((self, kwargs.get("start_new_session", False)))
    monkeypatch.setattr(subprocess, "Popen", Tracked)
    yield
    for p, own_group in started:
        if p.poll() is None:
            if own_group:  # torchrun and its ranks: the whole process group
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
            p.wait()


@pytest.fixture(autouse=True)
def malloc_left_alone(monkeypatch):
    """train.py and bench.py set glibc's malloc to keep freed memory for the rest of their process
    (sample.keep_freed_memory): their in-process runs here skip it, so that no test runs under settings an
    earlier test left (test_inference tests the real thing in processes of its own)."""
    for name in ("train", "bench"):
        if name in sys.modules:
            monkeypatch.setattr(sys.modules[name], "keep_freed_memory", lambda device: False)
