#!/usr/bin/env python3
"""The bare PyTorch + PEFT peer of Conduit's trainers: the plainest training loop a PEFT user writes.

    python bench/peft_peer.py JOB.json [--steps N] [--device auto|cpu|cuda] [--dtype auto|bf16|f32] [--threads N]

It reads a job of Conduit's torch worker (`src/train/torch/worker.py`'s input, written by bench/trainTorch.ts)
only for what a user of PEFT would choose the same way: the GGUF base (loaded with transformers' GGUF loader),
the windows (token ids and the positions that count in the loss), the LoRA rank, alpha and adapted weights, the
per-step learning rate and the thread count. Everything else is the textbook loop: `model(input_ids, labels)`
(the loss over the full logits, as transformers computes it), `backward`, AdamW `step`, `zero_grad`.

Prints one JSON object: tokens/s and tokens per CPU-second of the loop (the first step, which allocates, left
out of both and reported apart), peak RSS and peak GPU memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

# The transformers module of each llama.cpp LoRA target (a PEFT user names modules by these suffixes).
MODULES = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_output": "o_proj",
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
    "output": "lm_head",
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("job")
    parser.add_argument("--steps", type=int, default=0, help="train on the first N windows (0: all)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with open(args.job, encoding="utf8") as f:
        job = json.load(f)
    base_dir = os.path.dirname(os.path.abspath(args.job))
    path = lambda p: p if os.path.isabs(p) else os.path.join(base_dir, p)  # noqa: E731
    threads = args.threads or job["threads"]
    torch.set_num_threads(threads)
    device_name = args.device or job.get("device", "auto")
    device = torch.device("cuda" if device_name != "cpu" and torch.cuda.is_available() else "cpu")
    dtype_name = args.dtype or job.get("dtype", "auto")
    if dtype_name == "auto":
        if device.type == "cuda":
            dtype_name = "bf16" if torch.cuda.is_bf16_supported() else "f32"
        else:
            flags = open("/proc/cpuinfo", encoding="utf8").read()
            dtype_name = "bf16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "f32"
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32

    model_path = path(job["baseModelPath"])
    t_load = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(model_path), gguf_file=os.path.basename(model_path), dtype=dtype
    ).to(device)
    load_seconds = time.perf_counter() - t_load
    # The same adapted weights as the job: module suffixes of the targets the model has (a tied output head
    # has no adapter in llama.cpp, so the job leaves it out).
    targets = sorted({MODULES[w["name"].split(".")[2]] if w["name"].startswith("blk.") else "lm_head" for w in job["lora"]["weights"]})
    torch.manual_seed(job.get("seed", 0))
    model = get_peft_model(
        model,
        LoraConfig(r=job["lora"]["rank"], lora_alpha=job["lora"]["alpha"], lora_dropout=0.0, target_modules=targets),
    )
    params = [p for p in model.parameters() if p.requires_grad]
    rates = job["learningRates"]
    optimizer = torch.optim.AdamW(params, lr=rates[0], weight_decay=0.0, **({"fused": True} if device.type == "cuda" else {}))

    size = job["windowSize"]
    record = np.dtype([("sampleTokens", "<i4"), ("input", "<i4", (size,)), ("labels", "<i4", (size,)), ("mask", "u1", (size,))])
    windows = np.fromfile(path(job["train"]["file"]), dtype=record)
    steps = min(len(windows), args.steps) if args.steps > 0 else len(windows)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    model.train()
    first_wall = first_cpu = 0.0
    wall0 = time.perf_counter()
    cpu0 = time.process_time()
    for i in range(steps):
        w = windows[i]
        ids = torch.from_numpy(w["input"].astype(np.int64)).to(device).unsqueeze(0)
        # transformers shifts the labels itself: the label of position p + 1 is what position p predicts.
        labels = np.full(size, -100, dtype=np.int64)
        labels[1:] = np.where(w["mask"][:-1] == 1, w["labels"][:-1], -100)
        labels_t = torch.from_numpy(labels).to(device).unsqueeze(0)
        for group in optimizer.param_groups:
            group["lr"] = rates[i]
        loss = model(input_ids=ids, labels=labels_t).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if i == 0:
            sync()
            first_wall = time.perf_counter() - wall0
            first_cpu = time.process_time() - cpu0
    sync()
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    timed = steps - 1
    result = {
        "peer": "PEFT",
        "torch": torch.__version__,
        "device": device.type if device.type == "cpu" else f"cuda ({torch.cuda.get_device_name(device)})",
        "dtype": dtype_name,
        "threads": threads,
        "windowSize": size,
        "steps": steps,
        "loadSeconds": load_seconds,
        "firstStepSeconds": first_wall,
        "tokensPerSecond": timed * size / (wall - first_wall) if timed > 0 else 0.0,
        "tokensPerCpuSecond": timed * size / (cpu - first_cpu) if timed > 0 else 0.0,
        "finalLoss": float(loss.item()),
        "peakRssBytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if device.type == "cuda":
        result["peakGpuBytes"] = int(torch.cuda.max_memory_allocated(device))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
