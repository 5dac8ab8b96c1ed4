#!/usr/bin/env python3
"""Conduit's PyTorch + PEFT trainer worker: trains a LoRA adapter on a GGUF base model.

Conduit prepares everything that does not need the model's weights: it tokenizes the examples with the
served model's own tokenizer (llama.cpp), packs them into windows (token ids, next-token labels and a loss
mask per position), draws every epoch's order, the learning rate of every step and the steps after which
to evaluate. This worker loads the base from the same GGUF (transformers' GGUF loader, dequantized to
bf16 where the hardware computes it, F32 otherwise; on CUDA when there is a GPU), trains the adapter
(PEFT LoRA, AdamW), evaluates, keeps the best weights, checkpoints, measures per-example losses, and
writes the adapter's tensors raw in llama.cpp's layout; Conduit writes the GGUF adapter from them.

Protocol (the same messages as Conduit's llama.cpp trainer child, `src/train/protocol.ts`): JSON lines.
  stdin:  {"type": "job", "job": {...}} first, then possibly {"type": "cancel"}; end of input means the
          parent is gone, and the worker exits.
  stdout: {"type": "log", "line"}, {"type": "progress", ...}, then exactly one of {"type": "done", ...},
          {"type": "error", "message"} or {"type": "cancelled"}.
`--job FILE` runs a job file with no parent (benches, and a GPU machine without Node); `--probe` prints what
this Python can do (versions, CUDA, bf16) as one JSON object.

Data-parallel: under `torchrun` (Conduit starts it with `--job FILE --parent` when `CONDUIT_TRAIN_RANKS` or
`CONDUIT_TRAIN_NODES` asks for more than one rank) every rank trains a share of each optimizer step's windows and
the gradients are summed over the ranks; rank 0 alone sends messages and writes files. Ranks on other machines run
`torchrun … worker.py --follow` and take the job from rank 0.
"""

from __future__ import annotations

import argparse
import errno
import gc
import json
import math
import os
import resource
import sys
import threading
import time
from typing import Any, Callable, Optional

PROGRESS_INTERVAL_S = 0.5
CHECKPOINT_INTERVAL_S = 10.0
# How many epoch-end adapters a run keeps (the newest), as Conduit's `KEPT_CHECKPOINTS` (src/train/core/checkpoint.ts).
KEPT_CHECKPOINTS = 3
# Where the epoch-end adapters go in the checkpoint directory, raw (`step-<n>.f32` and `step-<n>.json`): the trainer
# process writes each as a GGUF adapter of the run's served type once the worker is done (`TORCH_KEPT_DIR`).
KEPT_DIR = "torch-kept"
# The llama.cpp tensor name of each LoRA target, and the module that holds it in a transformers model.
TARGET_MODULES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_config(directory: str, file: str) -> Any:
    """The model's configuration as transformers reads it from the GGUF, without special-token ids outside the
    vocabulary: llama.cpp writes 0xFFFFFFFF for "none" (stories260K's `tokenizer.ggml.padding_token_id`), which
    transformers would take as the embedding's padding index and refuse."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(directory, gguf_file=file)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not 0 <= value < vocab:
            setattr(config, key, None)
    return config

class Channel:
    """Writes protocol messages to stdout, one JSON object per line, whole lines only. A `quiet` channel (a rank
    other than the leader of a data-parallel run) sends only errors."""

    def __init__(self, quiet: bool = False) -> None:
        self.lock = threading.Lock()
        self.out = sys.stdout
        self.quiet = quiet

    def send(self, message: dict[str, Any]) -> None:
        if self.quiet and message.get("type") != "error":
            return
        line = json.dumps(message, allow_nan=False) + "\n"
        with self.lock:
            self.out.write(line)
            self.out.flush()

    def log(self, line: str) -> None:
        self.send({"type": "log", "line": line})


class Cancelled(Exception):
    pass


# ----------------------------------------------------------------------------------------------------------
# Pure helpers (unit-tested in test/python/test_worker.py)
# ----------------------------------------------------------------------------------------------------------


def permute_rows(rows: Any, n_head: int, n_head_kv: Optional[int] = None) -> Any:
    """llama.cpp's Q/K row order for llama-architecture models (`convert_hf_to_gguf.py`'s `permute`).

    transformers' GGUF loader undoes this permutation on load (its `LlamaTensorProcessor`), so an adapter's
    `lora_b` for `attn_q`/`attn_k`, trained on the unpermuted weights, is permuted back for llama.cpp.
    """
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    shape = rows.shape
    return rows.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def unpermute_rows(rows: Any, n_head: int, n_head_kv: Optional[int] = None) -> Any:
    """The inverse of `permute_rows`: llama.cpp's Q/K row order back to transformers' (an adapter read from a GGUF)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    shape = rows.shape
    return rows.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def dpo_terms(beta: float, policy: Any, reference: Any) -> tuple[Any, Any]:
    """DPO's loss and reward margin of examples from their answers' summed log-probabilities, `[..., 2]` (the
    preferred answer's, the non-preferred one's) under the trained model and the reference:
    margin = beta * ((pi_c - ref_c) - (pi_r - ref_r)), loss = -log sigmoid(margin)."""
    import torch.nn.functional as F

    margin = beta * ((policy[..., 0] - reference[..., 0]) - (policy[..., 1] - reference[..., 1]))
    return -F.logsigmoid(margin), margin


def native_dequantizer(library: str, threads: int) -> Callable[[Any, Any], Any]:
    """gguf-py's `dequantize(data, qtype)` computed by ggml's own C (`ggml_get_type_traits(type)->to_float`, from the
    libggml-base that serves the model) with rows split over `threads` threads (ctypes lets go of the GIL): the same
    values (ggml's reference is what gguf-py mirrors) 5-15x faster than gguf-py's numpy on K-quants. Types ggml
    does not quantize, or whose block layout differs from gguf-py's, go to gguf-py's own function."""
    import ctypes
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import gguf

    lib = ctypes.CDLL(library)

    class Traits(ctypes.Structure):  # ggml.h's struct ggml_type_traits
        _fields_ = [
            ("type_name", ctypes.c_char_p),
            ("blck_size", ctypes.c_int64),
            ("blck_size_interleave", ctypes.c_int64),
            ("type_size", ctypes.c_size_t),
            ("is_quantized", ctypes.c_bool),
            ("to_float", ctypes.c_void_p),
            ("from_float_ref", ctypes.c_void_p),
        ]

    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    python_dequantize = gguf.dequantize
    pool = ThreadPoolExecutor(max_workers=max(1, threads))

    def dequantize(data: Any, qtype: Any) -> Any:
        qtype = gguf.GGMLQuantizationType(qtype)
        sizes = gguf.GGML_QUANT_SIZES.get(qtype)
        traits = lib.ggml_get_type_traits(int(qtype)).contents
        if sizes is None or not traits.is_quantized or not traits.to_float or (traits.blck_size, traits.type_size) != sizes:
            return python_dequantize(data, qtype)
        block, size = sizes
        rows = np.ascontiguousarray(data).view(np.uint8)
        shape = rows.shape
        per_row = shape[-1] // size * block
        flat = rows.reshape(-1, shape[-1])
        out = np.empty((flat.shape[0], per_row), dtype=np.float32)
        to_float = to_float_t(traits.to_float)
        parts = max(1, min(threads, flat.shape[0]))
        bounds = [flat.shape[0] * i // parts for i in range(parts + 1)]

        def rows_of(i: int) -> None:
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:
                to_float(flat[lo:hi].ctypes.data, out[lo:hi].ctypes.data, (hi - lo) * per_row)

        list(pool.map(rows_of, range(parts)))
        return out.reshape(*shape[:-1], per_row)

    return dequantize


# The readers `fast_gguf_loading` shares between transformers' two parses of a file. Each maps the whole file: kept,
# its pages count in the worker's memory for the whole run (the 1.5B base's 1.07 GB), so they go once it is loaded.
GGUF_READERS: dict[tuple[str, str], Any] = {}


def fast_gguf_loading(library: Optional[str], threads: int) -> str:
    """Speeds up transformers' reading of a quantized GGUF, which asks gguf-py twice to parse the whole file (once for
    the configuration, once for the weights: a 150k-token vocabulary is seconds each time) and dequantizes in numpy:
    one parse per file, and ggml's dequantization (`native_dequantizer`) when its library is given and loads.
    Says what it did."""
    import gguf

    Reader = gguf.GGUFReader
    if not getattr(Reader, "conduit_shared", False):
        readers = GGUF_READERS

        def shared_reader(path: Any, mode: str = "r") -> Any:
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = Reader(path, mode)
            return readers[key]

        shared_reader.conduit_shared = True  # type: ignore[attr-defined]
        gguf.GGUFReader = shared_reader
    if not library:
        return "gguf-py's dequantizer (no ggml library given)"
    try:
        gguf.dequantize = native_dequantizer(library, threads)
    except (OSError, AttributeError) as error:
        return f"gguf-py's dequantizer (ggml's {os.path.basename(library)} would not load: {error})"
    return f"ggml's dequantizer ({threads} thread{'s' if threads != 1 else ''})"


def eval_noise(loss: float) -> float:
    """Eval-loss differences below this are noise (the same rule as the llama.cpp trainer)."""
    return max(0.001, 0.01 * loss)


class BestTracker:
    """The best evaluation so far and early stopping: the same rule as Conduit's `BestCheckpoint`
    (src/train/core/bestCheckpoint.ts). The best is the lowest eval loss, and it is what is served; early stopping
    counts the evaluations in a row that did not drop beyond `eval_noise` of the lowest."""

    def __init__(self, patience: Optional[int], state: Optional[dict[str, Any]] = None) -> None:
        self.patience = patience
        state = state or {}
        self.best: Optional[dict[str, Any]] = state.get("best")
        self.evals_since_best: int = state.get("evalsSinceBest", 0)
        self.lowest: Optional[float] = state.get("lowestEvalLoss", self.best["loss"] if self.best else None)
        self.stopped = False

    def observe(self, loss: float, epoch: int, step: int) -> bool:
        """Records an evaluation; returns True when its weights are the new best to keep (and serve)."""
        if self.lowest is None or loss < self.lowest - eval_noise(self.lowest):
            self.evals_since_best = 0
        else:
            self.evals_since_best += 1
            if self.patience is not None and self.evals_since_best >= self.patience:
                self.stopped = True
        self.lowest = loss if self.lowest is None else min(self.lowest, loss)
        if self.best is not None and loss > self.best["loss"]:
            return False
        self.best = {"loss": loss, "epoch": epoch, "step": step}
        return True

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"best": self.best, "evalsSinceBest": self.evals_since_best}
        if self.lowest is not None:
            out["lowestEvalLoss"] = self.lowest
        return out


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 == 1 else (ordered[middle - 1] + ordered[middle]) / 2


class ThreadTuner:
    """Picks the CPU threads between optimizer steps by timing them: the same policy as Conduit's `ThreadTuner`
    (src/train/core/threadTuner.ts), tested on the same cases (test/python/thread_tuner_cases.json). PyTorch's
    OpenMP threads spin-wait: on an idle 2-core machine two trained a 1.5B base 1.67x faster than one, while with a
    core busy elsewhere two trained many times slower (bench/README.md). Each candidate is timed for `trial_steps`
    steps (a candidate whose first step is already over `slowdown` times the fastest median so far, for that one step),
    the fastest kept for `settle_steps` steps or until its steps get `slowdown` times slower; the first step, which
    allocates, is left out."""

    def __init__(self, candidates: list[int], trial_steps: int = 3, settle_steps: int = 40, slowdown: float = 1.5) -> None:
        if not candidates:
            raise ValueError("ThreadTuner needs at least one candidate")
        self.candidates = list(candidates)
        self.trial_steps = trial_steps
        self.settle_steps = settle_steps
        self.slowdown = slowdown
        self.current = self.candidates[0]
        self.trial: Optional[dict[int, list[float]]] = {} if len(self.candidates) > 1 else None
        self.dropped: set[int] = set()
        self.chosen = 0
        self.chosen_time = math.inf
        self.settled_steps = 0
        self.recent: list[float] = []
        self.warm = False

    def threads(self) -> int:
        """The thread count for the coming step."""
        return self.current

    def observe(self, seconds: float) -> Optional[str]:
        """Records the step just taken with `threads()` threads; a sentence for the log when a trial ends on another
        count than the last one chose."""
        if not self.warm:
            self.warm = True
            return None
        if self.trial is not None:
            times = self.trial.setdefault(self.current, [])
            times.append(seconds)
            others = [median(t) for c, t in self.trial.items() if c != self.current and t]
            hopeless = len(times) == 1 and bool(others) and seconds > self.slowdown * min(others)
            if len(times) < self.trial_steps and not hopeless:
                return None
            if hopeless:
                self.dropped.add(self.current)
            pending = [
                c for c in self.candidates if c not in self.dropped and len(self.trial.get(c, [])) < self.trial_steps
            ]
            if pending:
                self.current = pending[0]
                return None
            return self.settle()
        if len(self.candidates) == 1:
            return None
        self.settled_steps += 1
        self.recent.append(seconds)
        if len(self.recent) > self.trial_steps:
            self.recent.pop(0)
        slower = len(self.recent) == self.trial_steps and median(self.recent) > self.slowdown * self.chosen_time
        if self.settled_steps >= self.settle_steps or slower:
            self.trial = {}
            self.current = self.candidates[0]
        return None

    def settle(self) -> Optional[str]:
        assert self.trial is not None
        medians = [(c, median(self.trial[c])) for c in self.candidates]
        best = medians[0]
        for m in medians[1:]:
            if m[1] < best[1]:
                best = m
        before = self.chosen
        self.trial = None
        self.dropped.clear()
        self.current, self.chosen_time = best
        self.chosen = best[0]
        self.settled_steps = 0
        self.recent = []
        if before == best[0]:
            return None
        steps = ", ".join(f"{c} \u2192 {t:.2f} s" for c, t in medians)
        return f"{best[0]} thread{'' if best[0] == 1 else 's'} (a step: {steps})"


def module_for(weight_name: str) -> str:
    """The transformers module suffix of a llama.cpp weight: `blk.3.attn_q.weight` -> `layers.3.self_attn.q_proj`."""
    if weight_name == "output.weight":
        return "lm_head"
    parts = weight_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight" or parts[2] not in TARGET_MODULES:
        raise ValueError(f"no transformers module is known for the llama.cpp weight {weight_name}")
    return f"layers.{parts[1]}.{TARGET_MODULES[parts[2]]}"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), where it is PyTorch's fastest type."""
    try:
        with open("/proc/cpuinfo", encoding="utf8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def group_end(start: int, windows_per_step: int, epoch_end: int, evaluate_after: Any) -> int:
    """Where the optimizer step that starts at window `start` ends (exclusive): after `windows_per_step` windows,
    cut at the end of the epoch and at an evaluation point, so evaluations and checkpoints fall between steps."""
    end = min(start + windows_per_step, epoch_end)
    for point in range(start + 1, end):
        if point in evaluate_after:
            return point
    return end


def shard(start: int, end: int, world: int, rank: int) -> range:
    """The windows of [start, end) that `rank` of `world` trains: every world-th, from its own offset."""
    return range(start + rank, end, world)


class Ranks:
    """Where this process stands in a data-parallel run. Alone (no `torchrun`): rank 0 of 1, and every collective
    is a no-op. Under `torchrun` (its `WORLD_SIZE`, `RANK`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE`): a `gloo` process
    group (the job, checkpoints and every collective on the CPU) and, on CUDA, an `nccl` group of the same ranks for
    the gradients; rank 0 is the leader, the only one that writes (messages, checkpoints, the adapter)."""

    def __init__(self, env: Optional[dict[str, str]] = None) -> None:
        env = dict(os.environ) if env is None else env
        self.world = int(env.get("WORLD_SIZE", "1"))
        self.rank = int(env.get("RANK", "0"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
        self.leader = self.rank == 0
        self.backend: Optional[str] = None
        self.group: Any = None

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def machines(self) -> int:
        return max(1, self.world // self.local_world)

    def connect(self) -> None:
        """Joins the process group (once): `gloo`, which every rank has whatever its device."""
        if not self.distributed or self.backend is not None:
            return
        import torch.distributed as dist

        dist.init_process_group(backend="gloo")
        self.backend = "gloo"

    def start(self, cuda: bool) -> None:
        """Joins the group; on CUDA, this rank takes its machine's GPU of its local rank and the gradients go through
        an `nccl` group."""
        if not self.distributed:
            return
        self.connect()
        if cuda and self.group is None:
            import torch
            import torch.distributed as dist

            torch.cuda.set_device(self.local_rank)
            self.group = dist.new_group(backend="nccl")
            self.backend = "nccl"

    def stop(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def sum(self, tensor: Any) -> Any:
        """Sums `tensor` over the ranks, in place."""
        if self.distributed:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def from_leader(self, value: Any) -> Any:
        """The leader's `value` on every rank (a checkpoint the leader read, which the other boxes may not have)."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value if self.leader else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def same_parameters(self, parameters: list[Any]) -> None:
        """Every rank starts from the leader's weights, whatever its own random initialisation drew."""
        if self.distributed:
            import torch.distributed as dist

            for p in parameters:
                dist.broadcast(p.data, src=0, group=self.group)


# ----------------------------------------------------------------------------------------------------------
# Windows written by Conduit
# ----------------------------------------------------------------------------------------------------------


class Windows:
    """Fixed-size records, little-endian, packed: int32 sample tokens (positions before the padding),
    int32 input[W], int32 labels[W], uint8 loss mask[W]."""

    def __init__(self, path: str, size: int) -> None:
        import numpy as np

        self.size = size
        self.dtype = np.dtype(
            [("sampleTokens", "<i4"), ("input", "<i4", (size,)), ("labels", "<i4", (size,)), ("mask", "u1", (size,))]
        )
        bytes_ = os.path.getsize(path)
        if bytes_ % self.dtype.itemsize != 0:
            raise ValueError(f"{path}: {bytes_} bytes is not a whole number of {size}-token windows")
        self.count = bytes_ // self.dtype.itemsize
        self.data = np.memmap(path, dtype=self.dtype, mode="r") if self.count > 0 else None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Any:
        assert self.data is not None
        return self.data[index]


# ----------------------------------------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------------------------------------


def probe() -> dict[str, Any]:
    import torch  # noqa: F401  (the imports are the check)
    import transformers
    import peft
    import gguf  # noqa: F401
    from importlib.metadata import version

    cuda = torch.cuda.is_available()
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "gguf": version("gguf"),
        "cuda": cuda,
        "cudaDevice": torch.cuda.get_device_name(0) if cuda else None,
        "bf16": (cuda and torch.cuda.is_bf16_supported()) or (not cuda and cpu_has_bf16()),
    }


class Trainer:
    def __init__(
        self, job: dict[str, Any], channel: Channel, cancelled: Callable[[], bool], ranks: Optional[Ranks] = None
    ) -> None:
        self.job = job
        self.channel = channel
        self.cancelled = cancelled
        self.ranks = ranks or Ranks({})
        self.started = time.perf_counter()

    def log(self, line: str) -> None:
        self.channel.log(f"trainer: {line}")

    def check_cancel(self) -> None:
        if self.cancelled():
            raise Cancelled()

    # -- setup -------------------------------------------------------------------------------------------

    def setup(self) -> None:
        import torch

        job = self.job
        ranks = self.ranks
        torch.manual_seed(job["seed"])
        # The ranks on one box share its cores.
        self.threads = max(1, job["threads"] // ranks.local_world)
        # One process on the CPU may choose its threads between steps (ThreadTuner): one fewer first.
        self.tuner: Optional[ThreadTuner] = (
            ThreadTuner([self.threads - 1, self.threads])
            if job.get("tuneThreads") and not ranks.distributed and self.threads >= 2
            else None
        )
        torch.set_num_threads(self.tuner.threads() if self.tuner else self.threads)
        wants = job.get("device", "auto")
        cuda = torch.cuda.is_available()
        if wants == "cuda" and not cuda:
            raise RuntimeError("CUDA was asked for, but this PyTorch sees no CUDA device")
        # Every rank computes where the leader does (a machine without a GPU cannot join a run on GPUs).
        ranks.connect()
        on_cuda = ranks.from_leader(cuda and wants != "cpu")
        if on_cuda and not cuda:
            raise RuntimeError("trainer: the run trains on CUDA, but this machine's PyTorch sees no CUDA device")
        if on_cuda and ranks.local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"trainer: {ranks.local_world} ranks on this machine, but PyTorch sees {torch.cuda.device_count()} CUDA devices"
            )
        self.device = torch.device(f"cuda:{ranks.local_rank}" if on_cuda else "cpu")
        if on_cuda:
            self.tuner = None
            torch.set_num_threads(self.threads)
        ranks.start(on_cuda)
        self.windows_per_step = int(job.get("windowsPerStep", 1))
        if self.windows_per_step < 1:
            raise RuntimeError(f"trainer: windowsPerStep must be at least 1, got {self.windows_per_step}")
        dtype = job.get("dtype", "auto")
        if dtype == "auto":
            bf16 = torch.cuda.is_bf16_supported() if self.device.type == "cuda" else cpu_has_bf16()
            dtype = "bf16" if bf16 else "f32"
        # The leader's type on every rank: their gradients are summed as one buffer.
        dtype = ranks.from_leader(dtype)
        self.dtype_name = dtype
        self.dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        where = (
            f"CUDA ({torch.cuda.get_device_name(self.device)})"
            if self.device.type == "cuda"
            else f"the CPU ({self.threads - 1} or {self.threads} threads, the faster chosen between steps)"
            if self.tuner
            else f"the CPU ({self.threads} thread{'s' if self.threads != 1 else ''})"
        )
        import peft
        import transformers

        self.log(
            f"PyTorch {torch.__version__}, transformers {transformers.__version__}, PEFT {peft.__version__} "
            f"on {where}, base weights in {dtype}"
            + (
                " (this CPU has no native bf16)"
                if dtype == "f32" and self.device.type == "cpu" and job.get("dtype", "auto") == "auto"
                else ""
            )
        )
        if ranks.distributed:
            nodes = ranks.machines
            self.log(
                f"data-parallel on {ranks.world} ranks ({ranks.local_world} per machine"
                + (f", {nodes} machines" if nodes > 1 else "")
                + f", {ranks.backend}), each on {'its GPU' if on_cuda else 'the CPU'} above; "
                f"{self.windows_per_step} windows per optimizer step, gradients summed over the ranks"
            )
        elif self.windows_per_step > 1:
            self.log(f"{self.windows_per_step} windows per optimizer step, their gradients accumulated")

    def load_model(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        path = self.job["baseModelPath"]
        if not os.path.isfile(path):
            raise RuntimeError(f"trainer: the base model {path} does not exist")
        t0 = time.perf_counter()
        # The ranks on one machine share its cache: its first rank loads (and makes the copy), the others wait.
        first_here = self.ranks.local_rank == 0
        if not first_here:
            self.ranks.barrier()
        cached = base_cache_dir(self.job.get("cacheDir"), path, self.dtype_name)
        if cached is not None and os.path.isfile(os.path.join(cached, "config.json")):
            model = AutoModelForCausalLM.from_pretrained(cached, dtype=self.dtype)
            how = f"from its {self.dtype_name} copy in the cache"
        else:
            directory, file = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
            dequantizer = fast_gguf_loading(self.job.get("ggmlLibrary"), self.threads)
            model = AutoModelForCausalLM.from_pretrained(
                directory, gguf_file=file, dtype=self.dtype, config=gguf_config(directory, file)
            )
            how = f"through transformers' GGUF reader and {dequantizer}"
            # Every weight is a copy by now (dequantized, or converted to the type it trains in): the file's mapping goes.
            GGUF_READERS.clear()
            gc.collect()
            if cached is not None:
                save_to_cache(model, cached)
                how += f"; kept a {self.dtype_name} copy for the next runs"
        if first_here:
            self.ranks.barrier()
        model.to(self.device)
        model.requires_grad_(False)
        model.config.use_cache = False
        self.architecture = model.config.model_type
        self.n_head = int(model.config.num_attention_heads)
        self.n_head_kv = int(getattr(model.config, "num_key_value_heads", None) or self.n_head)
        self.log(f"loaded {os.path.basename(path)} ({type(model).__name__}) {how} in {time.perf_counter() - t0:.1f} s")
        self.check_cancel()

        from peft import LoraConfig, get_peft_model

        lora = self.job["lora"]
        names = [name for name, _ in model.named_modules()]
        self.targets: list[tuple[dict[str, Any], str]] = []
        for weight in lora["weights"]:
            suffix = module_for(weight["name"])
            matches = [n for n in names if n == suffix or n.endswith("." + suffix)]
            if len(matches) != 1:
                raise RuntimeError(
                    f"the model has {len(matches)} modules named like {suffix} (for {weight['name']}); "
                    "this architecture's layout is not one the trainer knows"
                )
            self.targets.append((weight, matches[0]))
        config = LoraConfig(
            r=lora["rank"],
            lora_alpha=lora["alpha"],
            lora_dropout=0.0,
            bias="none",
            target_modules=[module for _, module in self.targets],
        )
        torch.manual_seed(self.job["seed"])
        self.model = get_peft_model(model, config)
        # The adapter's A and B of every target, in the order of `lora.weights`.
        self.adapter: list[tuple[dict[str, Any], Any, Any]] = []
        modules = dict(self.model.named_modules())
        for weight, module in self.targets:
            layer = modules["base_model.model." + module]
            a = layer.lora_A["default"].weight
            b = layer.lora_B["default"].weight
            if tuple(a.shape) != (lora["rank"], weight["inputs"]) or tuple(b.shape) != (weight["outputs"], lora["rank"]):
                raise RuntimeError(
                    f"{weight['name']}: the adapter's shapes {tuple(a.shape)}/{tuple(b.shape)} do not match the GGUF's "
                    f"{weight['inputs']}x{weight['outputs']}"
                )
            self.adapter.append((weight, a, b))
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.ranks.same_parameters(self.parameters)
        count = sum(p.numel() for p in self.parameters)
        self.trainable = (len(self.parameters), count)
        if self.job.get("optimizer", "adamw") == "sgd":
            self.optimizer = torch.optim.SGD(self.parameters, lr=self.job["learningRates"][0])
        else:
            self.optimizer = torch.optim.AdamW(
                self.parameters,
                lr=self.job["learningRates"][0],
                betas=(0.9, 0.999),
                eps=1e-8,
                weight_decay=self.job.get("weightDecay", 0.0),
                **({"fused": True} if self.device.type == "cuda" else {}),
            )

    # -- windows -----------------------------------------------------------------------------------------

    def window_losses(self, record: Any) -> Any:
        """Per-position losses (nats) of a window's masked-in positions, in order; None when it has none."""
        import numpy as np
        import torch
        import torch.nn.functional as F

        positions = np.flatnonzero(record["mask"])
        if positions.size == 0:
            return None
        ids = torch.from_numpy(np.asarray(record["input"], dtype=np.int64)).to(self.device, non_blocking=True)
        keep = torch.from_numpy(positions.astype(np.int64)).to(self.device, non_blocking=True)
        labels = torch.from_numpy(np.asarray(record["labels"][positions], dtype=np.int64)).to(
            self.device, non_blocking=True
        )
        # Only the positions whose loss counts go through the output head (the answers, by default); a window
        # trained in full takes the plain path (no gather of the hidden states).
        whole = positions.size == record["mask"].size
        logits = self.model(input_ids=ids.unsqueeze(0), logits_to_keep=0 if whole else keep, use_cache=False).logits[0]
        return F.cross_entropy(logits.float(), labels, reduction="none")

    # -- preference tuning (DPO) -------------------------------------------------------------------------

    def answer_logp(self, record: Any) -> Any:
        """The summed log-probability of a window's trained tokens (its answer): a scalar, with the gradient when
        grad mode is on."""
        import torch

        losses = self.window_losses(record)
        if losses is None:
            return torch.zeros((), device=self.device, dtype=torch.float32)
        return -losses.sum()

    def pair_logps(self, chosen: Any, rejected: Any, k: int) -> Any:
        """Example k's answers' summed log-probabilities, `[2]` (preferred, non-preferred)."""
        import torch

        return torch.stack([self.answer_logp(chosen[k]), self.answer_logp(rejected[k])])

    def dpo_rewards(self, reward_sum: Any, count: int, held: Optional[tuple[float, float]]) -> str:
        """A DPO run's reward margin and share of preferred wins for its log line (empty for a supervised run)."""
        if self.job.get("dpo") is None or count == 0:
            return ""
        margin, wins = (float(v) for v in reward_sum.tolist())
        line = f"; reward margin {margin / count:.4f}, preferred wins {100 * wins / count:.1f}%"
        if held is not None:
            line += f" (held out: {held[0]:.4f}, {100 * held[1]:.1f}%)"
        return line

    def load_init_adapter(self, path: str) -> None:
        """Starts the trained adapter from a LoRA adapter GGUF of the same base, rank, alpha and targets (a supervised
        run's): its tensors in llama.cpp's layout and any of the types adapters are served in, `lora_b` of a llama
        model's Q/K rows permuted back."""
        import numpy as np
        import torch
        from gguf import GGUFReader
        from gguf.quants import dequantize

        reader = GGUFReader(path)
        tensors = {t.name: t for t in reader.tensors}
        with torch.no_grad():
            for weight, a, b in self.adapter:
                name = weight["name"]
                found = [tensors.get(f"{name}.lora_a"), tensors.get(f"{name}.lora_b")]
                if found[0] is None or found[1] is None:
                    raise RuntimeError(f"trainer: the adapter to start from ({path}) has no {name}; it is of another shape")
                # F32, F16 or Q8_0 (`CONDUIT_ADAPTER_TYPE`), as served.
                a_rows = dequantize(found[0].data, found[0].tensor_type).astype(np.float32).reshape(tuple(a.shape))
                b_rows = dequantize(found[1].data, found[1].tensor_type).astype(np.float32).reshape(tuple(b.shape))
                target = name.split(".")[2] if name.startswith("blk.") else ""
                if self.architecture == "llama" and target == "attn_q":
                    b_rows = unpermute_rows(b_rows, self.n_head, self.n_head)
                elif self.architecture == "llama" and target == "attn_k":
                    b_rows = unpermute_rows(b_rows, self.n_head, self.n_head_kv)
                a.copy_(torch.from_numpy(np.ascontiguousarray(a_rows)).to(a.device, a.dtype))
                b.copy_(torch.from_numpy(np.ascontiguousarray(b_rows)).to(b.device, b.dtype))
        self.log(f"the adapter starts from {os.path.basename(path)} ({len(self.adapter)} weights)")

    def reference_logps(self, part: dict[str, Any], from_base: bool) -> Any:
        """Each example's answers' summed log-probabilities under the reference model, `[count, 2]`, computed once:
        the base with the adapter off, or the starting adapter's model (the weights before the first step)."""
        import contextlib

        import torch

        chosen = Windows(part["chosen"], self.job["windowSize"])
        rejected = Windows(part["rejected"], self.job["windowSize"])
        values = torch.zeros((part["count"], 2), device=self.device, dtype=torch.float32)
        self.model.eval()
        with torch.inference_mode(), (self.model.disable_adapter() if from_base else contextlib.nullcontext()):
            for k in range(part["count"]):
                self.check_cancel()
                values[k] = self.pair_logps(chosen, rejected, k)
        self.model.train()
        # A copy made outside inference mode: the training steps' graphs take it in.
        return values.clone()

    def dpo_measure(self, part: dict[str, Any], reference: Any) -> tuple[Any, Any]:
        """Every example's DPO loss and reward margin with the current weights, `[count]` each."""
        import torch

        dpo = self.job["dpo"]
        chosen = Windows(part["chosen"], self.job["windowSize"])
        rejected = Windows(part["rejected"], self.job["windowSize"])
        policy = torch.zeros((part["count"], 2), device=self.device, dtype=torch.float32)
        with torch.inference_mode():
            for k in range(part["count"]):
                self.check_cancel()
                policy[k] = self.pair_logps(chosen, rejected, k)
        return dpo_terms(dpo["beta"], policy, reference)

    def adapter_state(self) -> dict[str, Any]:
        return {name: p.detach().to("cpu", copy=True) for name, p in self.model.named_parameters() if p.requires_grad}

    def load_adapter_state(self, state: dict[str, Any]) -> None:
        import torch

        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if p.requires_grad:
                    p.copy_(state[name].to(p.device))

    # -- the run -----------------------------------------------------------------------------------------

    def run(self) -> Optional[dict[str, Any]]:
        """Trains the job; the `done` message on the leader, None on the other ranks of a data-parallel run."""
        import torch

        job = self.job
        self.setup()
        self.load_model()
        window_size = job["windowSize"]
        train = Windows(job["train"]["file"], window_size)
        evals = Windows(job["eval"]["file"], window_size) if job.get("eval") else None
        steps_per_epoch: list[int] = job["stepsPerEpoch"]
        total_steps = sum(steps_per_epoch)
        if len(train) != total_steps:
            raise RuntimeError(f"the windows file holds {len(train)} windows for {total_steps} steps")
        rates: list[float] = job["learningRates"]
        evaluate_after = set(job["evaluationPoints"])
        epochs = len(steps_per_epoch)
        epoch_starts = [sum(steps_per_epoch[:e]) for e in range(epochs)]

        checkpoint_dir: Optional[str] = job.get("checkpointDir")
        fingerprint = job.get("fingerprint", "")
        # The leader's checkpoint, on every rank (the other machines of a run may not have its files).
        ranks = self.ranks
        dpo: Optional[dict[str, Any]] = job.get("dpo")
        reference: dict[str, Any] = {}
        if dpo is not None:
            # The reference is the model before the first step, its log-probabilities computed once per example.
            if dpo.get("initAdapter"):
                self.load_init_adapter(dpo["initAdapter"])
            t0 = time.perf_counter()
            for split in ("train", "eval"):
                if dpo.get(split) is not None:
                    reference[split] = self.reference_logps(dpo[split], from_base=not dpo.get("initAdapter"))
            held = int(reference["eval"].shape[0]) if "eval" in reference else 0
            self.log(
                f"DPO (beta {dpo['beta']}): the reference model's log-probabilities of "
                f"{int(reference['train'].shape[0])} examples' answers"
                + (f" (and {held} held out)" if held > 0 else "")
                + f" in {time.perf_counter() - t0:.1f} s"
            )
            dpo_chosen = Windows(dpo["train"]["chosen"], window_size)
            dpo_rejected = Windows(dpo["train"]["rejected"], window_size)
        resume = ranks.from_leader(self.read_checkpoint(checkpoint_dir, fingerprint) if ranks.leader else None)
        step = 0
        tracker = BestTracker(job.get("earlyStoppingPatience"))
        best_state: Optional[dict[str, Any]] = None
        if resume is not None:
            meta, weights = resume
            self.load_adapter_state(weights["adapter"])
            self.optimizer.load_state_dict(weights["optimizer"])
            step = meta["step"]
            tracker = BestTracker(job.get("earlyStoppingPatience"), meta)
            if tracker.best is not None and checkpoint_dir is not None and ranks.leader:
                best_file = os.path.join(checkpoint_dir, "torch-best.pt")
                if os.path.exists(best_file):
                    best_state = torch.load(best_file, map_location="cpu")
            self.log(f"resuming from the checkpoint at step {step}, with the optimizer's state")
        resumed_from = step

        lora = job["lora"]
        blocks = sorted({w["name"].split(".")[1] for w in lora["weights"] if w["name"].startswith("blk.")})
        tensors, parameters = self.trainable
        self.log(
            f"LoRA rank {lora['rank']} alpha {lora['alpha']} on {', '.join(lora['targets'])} of {len(blocks)} blocks"
            + (" and the output head" if any(w["name"] == "output.weight" for w in lora["weights"]) else "")
            + f": {tensors} trainable tensors ({parameters} parameters); {total_steps} windows of {window_size} tokens, "
            f"{epochs} epochs"
            + (f", {len(evals)} eval windows" if evals is not None and len(evals) > 0 else "")
        )

        # Training time is the loop's wall (and CPU) time less evaluations: every overhead of ours (progress,
        # logs, checkpoints) counts; on CUDA the clock is read after the device has finished.
        clock = LoopClock(self.device)
        eval_seconds = 0.0
        train_tokens = sample_tokens = loss_tokens = 0
        last_progress = 0.0
        last_checkpoint: Optional[float] = None
        final_train_loss = math.nan
        final_eval_loss: Optional[float] = None
        eval_history: list[dict[str, Any]] = []
        epochs_done = 0
        for e in range(epochs):
            if step >= epoch_starts[e] + steps_per_epoch[e]:
                epochs_done = e + 1
        learning_rate = rates[step] if step < len(rates) else rates[-1]
        # The epoch's summed loss stays on the device until it is reported (no sync per step).
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        loss_count = 0
        # DPO: the epoch's summed reward margins and wins (examples whose preferred answer wins).
        reward_sum = torch.zeros(2, device=self.device, dtype=torch.float32)
        last_eval_rewards: Optional[tuple[float, float]] = None

        def epoch_of(s: int) -> int:
            for e in range(epochs):
                if s < epoch_starts[e] + steps_per_epoch[e]:
                    return e
            return epochs - 1

        def report(epoch: int, train_loss: float, eval_loss: Optional[float]) -> None:
            nonlocal last_progress
            last_progress = time.perf_counter()
            done = step - resumed_from
            train_seconds = clock.wall()
            per_step = (train_seconds + eval_seconds) / done if done > 0 else 0.0
            message: dict[str, Any] = {
                "type": "progress",
                "step": step,
                "totalSteps": total_steps,
                "epoch": epoch,
                "epochs": epochs,
                "trainLoss": train_loss if math.isfinite(train_loss) else 0.0,
                "learningRate": learning_rate,
                "tokensPerSecond": train_tokens / train_seconds if train_seconds > 0 else 0.0,
                "elapsedSeconds": time.perf_counter() - self.started,
                "etaSeconds": per_step * (total_steps - step),
            }
            if eval_loss is not None:
                message["evalLoss"] = eval_loss
            if dpo is not None and loss_count > 0:
                margin, wins = (float(v) for v in reward_sum.tolist())
                message["rewardMargin"] = margin / loss_count
                message["rewardAccuracy"] = wins / loss_count
            if dpo is not None and eval_loss is not None and last_eval_rewards is not None:
                message["evalRewardMargin"], message["evalRewardAccuracy"] = last_eval_rewards
            self.channel.send(message)

        def current_train_loss() -> float:
            value = float(loss_sum.item()) / loss_count if loss_count > 0 else math.nan
            if loss_count > 0 and not math.isfinite(value):
                raise RuntimeError(f"trainer: loss became {value}; try a lower learning rate")
            return value

        def evaluate() -> float:
            """The eval set's mean loss per trained token; each rank computes a shard of its windows. DPO: the mean DPO
            loss per held-out example (on the leader; its margin and accuracy kept for the report)."""
            nonlocal last_eval_rewards
            if dpo is not None:
                losses, margins = self.dpo_measure(dpo["eval"], reference["eval"])
                last_eval_rewards = (float(margins.mean().item()), float((margins > 0).float().mean().item()))
                return float(losses.mean().item())
            assert evals is not None
            total = torch.zeros((), device=self.device, dtype=torch.float32)
            count = 0
            with torch.inference_mode():
                for k in shard(0, len(evals), ranks.world, ranks.rank):
                    self.check_cancel()
                    losses = self.window_losses(evals[k])
                    if losses is not None:
                        total += losses.sum()
                        count += losses.numel()
            summed = ranks.sum(torch.tensor([float(total.item()), float(count)], device=self.device, dtype=torch.float64))
            total_loss, total_count = summed.tolist()
            return total_loss / total_count if total_count > 0 else math.nan

        def train_step(start: int, end: int) -> Optional[Any]:
            """One optimizer step on windows [start, end): each window's mean loss weighs the same, each rank
            back-propagates its shard and the gradients are summed over the ranks (one all-reduce, which carries
            the step's summed loss too). None when no window of the step has a trained token."""
            trained = [k for k in range(start, end) if train[k]["mask"].any()]
            if not trained:
                return None
            step_loss = torch.zeros((), device=self.device, dtype=torch.float32)
            # DPO: the step's summed reward margins and wins.
            rewards = torch.zeros(2, device=self.device, dtype=torch.float32)
            for k in shard(start, end, ranks.world, ranks.rank):
                if dpo is not None:
                    # Each example weighs the same: its DPO loss, over its two answers' summed log-probabilities.
                    example = dpo["steps"][k]
                    policy = self.pair_logps(dpo_chosen, dpo_rejected, example)
                    loss, margin = dpo_terms(dpo["beta"], policy, reference["train"][example])
                    (loss / len(trained)).backward()
                    step_loss += loss.detach()
                    rewards += torch.stack([margin.detach(), (margin.detach() > 0).float()])
                    continue
                losses = self.window_losses(train[k])
                if losses is not None:
                    (losses.mean() / len(trained)).backward()
                    step_loss += losses.detach().sum()
            if ranks.distributed:
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
                flat = ranks.sum(torch.cat([g.reshape(-1) for g in grads] + [step_loss.reshape(1), rewards]))
                at = 0
                for p in self.parameters:
                    p.grad = flat[at : at + p.numel()].view_as(p)
                    at += p.numel()
                step_loss = flat[at]
                rewards = flat[at + 1 : at + 3]
            lr = rates[start]
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return step_loss, trained, rewards

        self.model.train()
        while step < total_steps:
            self.check_cancel()
            epoch = epoch_of(step)
            if step == epoch_starts[epoch] or step == resumed_from:
                loss_sum.zero_()
                reward_sum.zero_()
                loss_count = 0
            learning_rate = rates[step]
            end = group_end(step, self.windows_per_step, epoch_starts[epoch] + steps_per_epoch[epoch], evaluate_after)
            if self.tuner is not None and self.tuner.threads() != torch.get_num_threads():
                torch.set_num_threads(self.tuner.threads())
            step_started = time.perf_counter()
            done = train_step(step, end)
            if self.tuner is not None and done is not None:
                chose = self.tuner.observe(time.perf_counter() - step_started)
                if chose is not None:
                    self.log(f"PyTorch on {chose}")
            if done is not None:
                step_loss, trained, rewards = done
                # Every rank counts every window of the step (each reads them all): only the loss travelled.
                masked = sum(int(train[k]["mask"].sum()) for k in trained)
                loss_sum += step_loss
                # DPO's loss is per example, the supervised loss per trained token.
                loss_count += len(trained) if dpo is not None else masked
                reward_sum += rewards
                loss_tokens += masked
                train_tokens += window_size * len(trained)
                sample_tokens += sum(int(train[k]["sampleTokens"]) for k in trained)
                if dpo is not None:
                    # Each example trains through its non-preferred window too.
                    examples = [dpo["steps"][k] for k in trained]
                    loss_tokens += sum(int(dpo_rejected[e]["mask"].sum()) for e in examples)
                    train_tokens += window_size * len(trained)
                    sample_tokens += sum(int(dpo_rejected[e]["sampleTokens"]) for e in examples)
                clock.step_done()
            step = end
            if step in evaluate_after:
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                final_train_loss = current_train_loss()
                eval_loss: Optional[float] = None
                if (evals is not None and len(evals) > 0) or (dpo is not None and "eval" in reference):
                    self.model.eval()
                    with clock.paused() as paused:
                        eval_loss = evaluate()
                    eval_seconds += paused.seconds
                    self.model.train()
                    final_eval_loss = eval_loss
                    eval_history.append(
                        {"epoch": epoch + 1, "step": step, "trainLoss": final_train_loss, "evalLoss": eval_loss}
                    )
                    if tracker.observe(eval_loss, epoch + 1, step):
                        best_state = self.adapter_state()
                        if checkpoint_dir is not None and ranks.leader:
                            atomic_save(os.path.join(checkpoint_dir, "torch-best.pt"), best_state)
                report(epoch + 1, final_train_loss, eval_loss)
                epoch_done = step == epoch_starts[epoch] + steps_per_epoch[epoch]
                best = tracker.best
                self.log(
                    (f"epoch {epoch + 1}/{epochs}" if epoch_done else f"step {step}/{total_steps} (epoch {epoch + 1})")
                    + f" train loss {final_train_loss:.4f}"
                    + (
                        ""
                        if eval_loss is None
                        else f" eval loss {eval_loss:.4f}" + (" (best)" if best is not None and best["step"] == step else "")
                    )
                    + f" lr {learning_rate:.2e}"
                    + (self.dpo_rewards(reward_sum, loss_count, last_eval_rewards if eval_loss is not None else None))
                )
                now = time.perf_counter()
                if (
                    checkpoint_dir is not None
                    and ranks.leader
                    and (last_checkpoint is None or now - last_checkpoint >= CHECKPOINT_INTERVAL_S)
                ):
                    last_checkpoint = now
                    self.write_checkpoint(checkpoint_dir, fingerprint, step, tracker)
                if epoch_done:
                    epochs_done = epoch + 1
                    if checkpoint_dir is not None and ranks.leader:
                        kept = {"step": step, "epoch": epoch + 1, "trainLoss": final_train_loss}
                        if eval_loss is not None:
                            kept["evalLoss"] = eval_loss
                        self.keep_epoch(checkpoint_dir, kept)
                if tracker.stopped:
                    assert best is not None
                    self.log(
                        f"stopping early: the eval loss has not improved on {best['loss']:.4f} (epoch {best['epoch']}) "
                        f"for {tracker.evals_since_best} evaluations"
                    )
                    break
            elif time.perf_counter() - last_progress >= PROGRESS_INTERVAL_S:
                report(epoch + 1, current_train_loss(), None)
        clock.stop()
        train_seconds = clock.wall()
        # The loop's CPU time of every rank: tokens per CPU-second mean the same on one rank and on many.
        train_cpu_seconds = float(ranks.sum(torch.tensor([clock.cpu()], device=self.device, dtype=torch.float64)).item())
        if step > resumed_from:
            final_train_loss = current_train_loss()
        self.check_cancel()
        if not ranks.leader:
            # The leader writes everything that outlives the run: the per-example losses, the adapter, the stats.
            return None

        # The phases after the last step, each logged with its time: a large model spends minutes here.
        best = tracker.best
        if best is not None and best["step"] != step and best_state is not None:
            self.load_adapter_state(best_state)
            self.log(
                f"writing the best checkpoint (epoch {best['epoch']}, step {best['step']}, eval loss {best['loss']:.4f})"
            )
        elif best is not None:
            self.log(
                f"the last step is the best checkpoint (epoch {best['epoch']}, step {best['step']}, eval loss {best['loss']:.4f})"
            )

        loss_windows = sum(len(Windows(part["file"], window_size)) for part in job["examples"])
        phase = time.perf_counter()
        if dpo is not None:
            self.log("measuring each example's DPO loss with the weights written")
            examples = self.dpo_example_losses(reference)
        else:
            self.log(f"measuring each example's loss with the weights written ({loss_windows} windows)")
            examples = self.example_losses()
        self.log(f"measured each example's loss in {time.perf_counter() - phase:.1f} s")
        phase = time.perf_counter()
        adapter_bytes = self.write_adapter(job["adapterFile"])
        self.log(f"saved the adapter's tensors in {time.perf_counter() - phase:.1f} s")
        if job.get("probe"):
            self.write_probe(job["probe"]["tokens"], job["probe"]["file"])
        if job.get("peftDir"):
            # PEFT's own files (Hugging Face's layout, Q/K rows as transformers holds them), as PEFT users have them.
            self.model.save_pretrained(job["peftDir"], safe_serialization=True)
            self.log(f"saved the adapter as PEFT files in {job['peftDir']}")
        stats: dict[str, Any] = {
            "steps": step,
            "epochs": epochs_done,
            "trainTokens": train_tokens,
            "sampleTokens": sample_tokens,
            "lossTokens": loss_tokens,
            "windowSize": window_size,
            "finalTrainLoss": final_train_loss if math.isfinite(final_train_loss) else None,
            "stoppedEarly": tracker.stopped,
            "resumedFromStep": resumed_from,
            "tokensPerSecond": train_tokens / train_seconds if train_seconds > 0 else 0.0,
            "trainSeconds": train_seconds + eval_seconds,
            # For benches: the training loop's CPU time (all threads) and its first step, which allocates.
            "trainCpuSeconds": train_cpu_seconds,
            "firstStepSeconds": clock.first_wall,
            "firstStepCpuSeconds": clock.first_cpu,
            "elapsedSeconds": time.perf_counter() - self.started,
            "trainableTensors": tensors,
            "trainableParameters": parameters,
            "peakRssBytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "device": self.device.type,
            "dtype": self.dtype_name,
        }
        if final_eval_loss is not None:
            stats["finalEvalLoss"] = final_eval_loss
        if best is not None:
            stats.update({"bestEvalLoss": best["loss"], "bestEpoch": best["epoch"], "bestStep": best["step"]})
        if self.device.type == "cuda":
            stats["peakGpuBytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return {
            "type": "done",
            "stats": stats,
            "evalHistory": eval_history,
            "adapterBytes": adapter_bytes,
            "examples": examples,
        }

    # -- per-example losses --------------------------------------------------------------------------------

    def example_losses(self) -> dict[str, list[Any]]:
        """Each example's mean loss per trained token with the written weights, in order, as the llama.cpp trainer."""
        import torch

        job = self.job
        out_file = job.get("lossesFile")
        sink = open(out_file, "w", encoding="utf8") if out_file else None
        result: dict[str, list[Any]] = {"train": [], "eval": []}
        try:
            self.model.eval()
            with torch.inference_mode():
                for part in job["examples"]:
                    windows = Windows(part["file"], job["windowSize"])
                    with open(part["spansFile"], encoding="utf8") as f:
                        spans: list[list[list[int]]] = json.load(f)
                    if len(spans) != len(windows):
                        raise RuntimeError(f"{part['spansFile']}: {len(spans)} span lists for {len(windows)} windows")

                    def emit(value: dict[str, Any]) -> None:
                        if sink is not None:
                            sink.write(json.dumps(value) + "\n")
                        else:
                            result[part["split"]].append(value)

                    following = 0
                    for k in range(len(windows)):
                        self.check_cancel()
                        record = windows[k]
                        losses = self.window_losses(record)
                        rows = [0.0] * job["windowSize"]
                        if losses is not None:
                            import numpy as np

                            for position, value in zip(np.flatnonzero(record["mask"]).tolist(), losses.tolist()):
                                rows[position] = value
                        mask = record["mask"]
                        for sample, start, length in spans[k]:
                            for _ in range(following, sample):
                                emit({"loss": None, "tokens": 0})
                            trained = [rows[p] for p in range(start, start + length) if mask[p]]
                            emit({"loss": sum(trained) / len(trained) if trained else None, "tokens": len(trained)})
                            following = sample + 1
                    for _ in range(following, part["count"]):
                        emit({"loss": None, "tokens": 0})
            if sink is not None:
                sink.flush()
                os.fsync(sink.fileno())
        finally:
            if sink is not None:
                sink.close()
        return result

    def dpo_example_losses(self, reference: dict[str, Any]) -> dict[str, list[Any]]:
        """Each preference example's DPO loss with the written weights (training examples, then held-out ones), and
        its preferred answer's trained tokens; in the losses file when the job names one."""
        job = self.job
        dpo = job["dpo"]
        result: dict[str, list[Any]] = {"train": [], "eval": []}
        self.model.eval()
        for split in ("train", "eval"):
            part = dpo.get(split)
            if part is None:
                continue
            losses, _ = self.dpo_measure(part, reference[split])
            chosen = Windows(part["chosen"], job["windowSize"])
            for k, loss in enumerate(losses.tolist()):
                result[split].append({"loss": loss, "tokens": int(chosen[k]["mask"].sum())})
        out_file = job.get("lossesFile")
        if out_file:
            with open(out_file, "w", encoding="utf8") as sink:
                for split in ("train", "eval"):
                    for value in result[split]:
                        sink.write(json.dumps(value) + "\n")
                sink.flush()
                os.fsync(sink.fileno())
            return {"train": [], "eval": []}
        return result

    # -- adapter and checkpoints -------------------------------------------------------------------------------

    def write_adapter(self, path: str) -> int:
        """The adapter's tensors as raw little-endian F32, in llama.cpp's layout: for each weight of `lora.weights`
        in order, `lora_a` ([rank, in] row-major, ggml [in, rank]) then `lora_b` ([out, rank], ggml [rank, out])."""
        import numpy as np

        temp = f"{path}.tmp-{os.getpid()}"
        written = 0
        with open(temp, "wb") as f:
            for weight, a, b in self.adapter:
                a_rows = a.detach().float().cpu().numpy()
                b_rows = b.detach().float().cpu().numpy()
                target = weight["name"].split(".")[2] if weight["name"].startswith("blk.") else ""
                if self.architecture == "llama" and target == "attn_q":
                    b_rows = permute_rows(b_rows, self.n_head, self.n_head)
                elif self.architecture == "llama" and target == "attn_k":
                    b_rows = permute_rows(b_rows, self.n_head, self.n_head_kv)
                for rows in (a_rows, b_rows):
                    data = np.ascontiguousarray(rows, dtype="<f4").tobytes()
                    f.write(data)
                    written += len(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
        return written

    def write_probe(self, tokens: list[int], path: str) -> None:
        """The trained model's logits for `tokens` (one sequence), raw F32 [len(tokens), vocab]: what the exported
        adapter must reproduce when llama.cpp serves it (the tests compare the two)."""
        import numpy as np
        import torch

        with torch.inference_mode():
            ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=ids, use_cache=False).logits[0].float().cpu().numpy()
        with open(path, "wb") as f:
            f.write(np.ascontiguousarray(logits, dtype="<f4").tobytes())

    def keep_epoch(self, directory: str, checkpoint: dict[str, Any]) -> None:
        """Keeps the adapter at an epoch's end (its tensors as `write_adapter` writes them, then the JSON) and removes
        the oldest past KEPT_CHECKPOINTS. A resumed run that trains the same step again writes it again."""
        kept = os.path.join(directory, KEPT_DIR)
        os.makedirs(kept, exist_ok=True)
        name = os.path.join(kept, f"step-{checkpoint['step']}")
        self.write_adapter(f"{name}.f32")
        atomic_write_text(f"{name}.json", json.dumps(checkpoint))
        steps = sorted(
            int(entry[5:-5])
            for entry in os.listdir(kept)
            if entry.startswith("step-") and entry.endswith(".json") and entry[5:-5].isdigit()
        )
        for old in steps[:-KEPT_CHECKPOINTS]:
            for suffix in (".json", ".f32"):
                try:
                    os.remove(os.path.join(kept, f"step-{old}{suffix}"))
                except FileNotFoundError:
                    pass

    def write_checkpoint(self, directory: str, fingerprint: str, step: int, tracker: BestTracker) -> None:
        os.makedirs(directory, exist_ok=True)
        atomic_save(
            os.path.join(directory, "torch-latest.pt"),
            {"adapter": self.adapter_state(), "optimizer": self.optimizer.state_dict()},
        )
        meta = {"fingerprint": fingerprint, "step": step, **tracker.state()}
        atomic_write_text(os.path.join(directory, "torch-latest.json"), json.dumps(meta))

    def read_checkpoint(self, directory: Optional[str], fingerprint: str) -> Optional[tuple[dict[str, Any], dict[str, Any]]]:
        import torch

        if directory is None:
            return None
        try:
            with open(os.path.join(directory, "torch-latest.json"), encoding="utf8") as f:
                meta = json.load(f)
            if meta.get("fingerprint") != fingerprint:
                return None
            weights = torch.load(os.path.join(directory, "torch-latest.pt"), map_location="cpu")
            return meta, weights
        except (OSError, ValueError, RuntimeError):
            return None


class LoopClock:
    """Wall and CPU time of the training loop, less the spans spent in `paused()` (evaluations)."""

    class Span:
        seconds = 0.0

    def __init__(self, device: Any) -> None:
        self.device = device
        self.wall_start = time.perf_counter()
        self.cpu_start = time.process_time()
        self.wall_paused = 0.0
        self.cpu_paused = 0.0
        self.stopped: Optional[tuple[float, float]] = None
        self.first_wall: Optional[float] = None
        self.first_cpu: Optional[float] = None

    def sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def step_done(self) -> None:
        if self.first_wall is None:
            self.sync()
            self.first_wall = self.wall()
            self.first_cpu = self.cpu()

    def paused(self) -> Any:
        clock = self

        class Paused:
            def __enter__(self) -> "LoopClock.Span":
                clock.sync()
                self.span = LoopClock.Span()
                self.wall = time.perf_counter()
                self.cpu = time.process_time()
                return self.span

            def __exit__(self, *_: Any) -> None:
                clock.sync()
                self.span.seconds = time.perf_counter() - self.wall
                clock.wall_paused += self.span.seconds
                clock.cpu_paused += time.process_time() - self.cpu

        return Paused()

    def stop(self) -> None:
        self.sync()
        self.stopped = (time.perf_counter(), time.process_time())

    def wall(self) -> float:
        now = self.stopped[0] if self.stopped else time.perf_counter()
        return now - self.wall_start - self.wall_paused

    def cpu(self) -> float:
        now = self.stopped[1] if self.stopped else time.process_time()
        return now - self.cpu_start - self.cpu_paused


def base_cache_dir(cache: Optional[str], model_path: str, dtype: str) -> Optional[str]:
    """Where a base model's dequantized copy is kept: transformers parses a GGUF's vocabulary and dequantizes its
    weights in Python on every load (15 s for SmolLM2-135M, 38 s for Gemma 3 270M on 2 cores), a saved copy
    loads in about a second. Keyed by the file (path, size, modification time), the weight type and the
    transformers version, so a replaced model or an upgrade makes a new copy."""
    if not cache:
        return None
    import hashlib

    import transformers

    real = os.path.realpath(model_path)
    stat = os.stat(real)
    key = f"{real}:{stat.st_size}:{stat.st_mtime_ns}:{dtype}:{transformers.__version__}"
    name = os.path.basename(real).removesuffix(".gguf")
    return os.path.join(cache, f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}")


def save_to_cache(model: Any, directory: str) -> None:
    """Saves the model (safetensors) to a temp folder renamed into place, and removes the older copies of the same
    file; a failure (a full disk) costs only the next run's load time."""
    import shutil

    parent = os.path.dirname(directory)
    temp = f"{directory}.tmp-{os.getpid()}"
    try:
        from safetensors.torch import save_model

        os.makedirs(temp, exist_ok=True)
        # A model loaded from a GGUF is marked quantized, which save_pretrained refuses: its weights are plain
        # tensors by now, so they are saved as they are (shared ones, a tied head, once) with the config less the mark.
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        type(model.config).from_dict(config).save_pretrained(temp)
        save_model(model, os.path.join(temp, "model.safetensors"), metadata={"format": "pt"})
        os.replace(temp, directory)
        prefix = os.path.basename(directory).rsplit("-", 1)[0] + "-"
        for entry in os.listdir(parent):
            # Older copies of the same file, and the temp folders of workers killed while saving.
            if entry.startswith(prefix) and os.path.join(parent, entry) != directory:
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
    except Exception as error:  # noqa: BLE001 — a copy that cannot be made costs the next run's load time, nothing else
        print(f"trainer: could not keep a copy of the base model in {parent}: {error!r}", file=sys.stderr)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def atomic_save(path: str, value: Any) -> None:
    import torch

    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.tmp-{os.getpid()}"
    torch.save(value, temp)
    os.replace(temp, path)


def atomic_write_text(path: str, text: str) -> None:
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


# ----------------------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------------------


def run_job(job: dict[str, Any], channel: Channel, cancelled: Callable[[], bool], ranks: Optional[Ranks] = None) -> int:
    ranks = ranks or Ranks({})
    try:
        result = Trainer(job, channel, cancelled, ranks).run()
    except Cancelled:
        channel.send({"type": "cancelled"})
        return 0
    except Exception as error:  # noqa: BLE001 — every failure becomes the protocol's error message
        import traceback

        traceback.print_exc(file=sys.stderr)
        message = str(error) if str(error).startswith("trainer:") else f"trainer: {type(error).__name__}: {error}"
        if ranks.distributed:
            message = message.replace("trainer: ", f"trainer: rank {ranks.rank} of {ranks.world}: ", 1)
        failure: dict[str, Any] = {"type": "error", "message": message}
        # A full disk (or quota) is told apart, so the run's error can say so in the API's words.
        errno_code = getattr(error, "errno", None)
        if isinstance(error, OSError) and errno_code in (errno.ENOSPC, errno.EDQUOT):
            failure["code"] = errno.errorcode[errno_code]
        channel.send(failure)
        return 1
    ranks.stop()
    if result is not None:
        channel.send(result)
    return 0


def serve(channel: Channel) -> int:
    """Reads the job from stdin, then watches stdin for a cancel (or its end: the parent is gone)."""
    first = sys.stdin.readline()
    if not first:
        return 1
    message = json.loads(first)
    if message.get("type") != "job":
        channel.send({"type": "error", "message": "trainer: the first message must be the job"})
        return 1

    def watch() -> None:
        for line in sys.stdin:
            if line.strip() and json.loads(line).get("type") == "cancel":
                # Nothing of a cancelled run is kept, so there is nothing to finish: stop now, mid-step.
                channel.send({"type": "cancelled"})
                os._exit(0)
        os._exit(1)  # the parent is gone; the run must not go on alone

    threading.Thread(target=watch, daemon=True).start()
    return run_job(message["job"], channel, lambda: False)


def job_bundle(job: dict[str, Any]) -> dict[str, Any]:
    """What the ranks on other machines than the leader's need of a job: the job and its training and eval windows
    (the base model they read at the same path; everything else only the leader writes)."""

    def read(part: Optional[dict[str, Any]]) -> Optional[bytes]:
        if not part:
            return None
        with open(part["file"], "rb") as f:
            return f.read()

    return {"job": job, "train": read(job["train"]), "eval": read(job.get("eval"))}


def receive_job(bundle: dict[str, Any], directory: str) -> dict[str, Any]:
    """The job of a rank on another machine: the leader's, its windows written to `directory`, without what only
    the leader writes (per-example losses, checkpoints, the adapter, the probe)."""
    job = dict(bundle["job"])
    for part in ("train", "eval"):
        data = bundle[part]
        if data is None:
            job[part] = None
            continue
        file = os.path.join(directory, f"{part}.windows")
        with open(file, "wb") as f:
            f.write(data)
        job[part] = {"file": file}
    job.update(
        examples=[],
        lossesFile=None,
        checkpointDir=None,
        probe=None,
        adapterFile=os.path.join(directory, "adapter.f32"),
    )
    return job


def follow(channel: Channel, ranks: Ranks) -> int:
    """A rank on another machine than the leader's (`torchrun … worker.py --follow`): takes its job from the leader."""
    import shutil
    import tempfile

    if not ranks.distributed:
        channel.send({"type": "error", "message": "trainer: --follow runs under torchrun, as a rank of a run"})
        return 1
    ranks.connect()
    bundle = ranks.from_leader(None)
    directory = tempfile.mkdtemp(prefix="conduit-rank-")
    try:
        return run_job(receive_job(bundle, directory), channel, lambda: False, ranks)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def exit_when_stdin_ends() -> None:
    """The parent closed its end of stdin (a cancel), or is gone: nothing of the run is kept, so stop now."""
    while sys.stdin.buffer.read(65536):
        pass
    os._exit(1)


PATH_FIELDS = ("baseModelPath", "ggmlLibrary", "file", "spansFile", "lossesFile", "checkpointDir", "adapterFile", "cacheDir", "peftDir")


def resolve_paths(value: Any, base: str) -> Any:
    """A job file's relative paths are relative to the file (a job prepared on one machine runs on another)."""
    if isinstance(value, dict):
        return {
            k: (os.path.join(base, v) if k in PATH_FIELDS and isinstance(v, str) and not os.path.isabs(v) else resolve_paths(v, base))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [resolve_paths(v, base) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--probe", action="store_true", help="print versions, CUDA and bf16 support as JSON")
    parser.add_argument("--job", help="run this job file with no parent process")
    parser.add_argument(
        "--parent",
        action="store_true",
        help="with --job: stdin is the parent's pipe, and its end stops the run at once (the ranks torchrun starts "
        "share it, so it carries no messages: the parent cancels by closing it)",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="under torchrun on another machine than Conduit's: take the job from the run's first rank",
    )
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")
    # Deprecation notices of the libraries (PEFT calling transformers' renamed helpers) are not the run's concern.
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    if args.probe:
        print(json.dumps(probe()))
        return 0
    ranks = Ranks()
    channel = Channel(quiet=not ranks.leader)
    if args.follow:
        return follow(channel, ranks)
    if args.job:
        with open(args.job, encoding="utf8") as f:
            job = resolve_paths(json.load(f), os.path.dirname(os.path.abspath(args.job)))
        if args.parent:
            threading.Thread(target=exit_when_stdin_ends, daemon=True).start()
        if ranks.machines > 1:
            # The ranks on the other machines (`--follow`) take the job from here; those on this one have it.
            ranks.connect()
            ranks.from_leader(job_bundle(job) if ranks.leader else None)
        return run_job(job, channel, lambda: False, ranks)
    if ranks.distributed:
        channel.send({"type": "error", "message": "trainer: the ranks of a data-parallel run take their job from --job"})
        return 1
    return serve(channel)


if __name__ == "__main__":
    sys.exit(main())
