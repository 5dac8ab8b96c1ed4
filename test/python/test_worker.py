"""Unit tests of the torch worker's pure parts (run by test/torchTrainer.test.ts with the worker's Python)."""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "train", "torch"))

import numpy as np  # noqa: E402

import worker  # noqa: E402


class PermuteRows(unittest.TestCase):
    def test_undoes_transformers_reverse_permutation(self) -> None:
        from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

        for n_head, n_head_kv, rows in ((4, 4, 128), (32, 4, 256), (9, 3, 192)):
            llama_cpp = np.random.default_rng(n_head).standard_normal((rows, 5)).astype(np.float32)
            processor = LlamaTensorProcessor(config={"num_attention_heads": n_head, "num_key_value_heads": n_head_kv})
            name = "blk.0.attn_k.weight" if rows < n_head * 64 else "blk.0.attn_q.weight"
            hf = processor.process(weights=llama_cpp, name=name).weights
            back = worker.permute_rows(hf, n_head, n_head_kv if "attn_k" in name else n_head)
            np.testing.assert_array_equal(back, llama_cpp)


class UnpermuteRows(unittest.TestCase):
    def test_reads_back_what_permute_rows_wrote(self) -> None:
        for n_head, n_head_kv, rows in ((4, 4, 128), (32, 4, 256), (9, 3, 192)):
            hf = np.random.default_rng(n_head).standard_normal((rows, 5)).astype(np.float32)
            written = worker.permute_rows(hf, n_head, n_head_kv)
            np.testing.assert_array_equal(worker.unpermute_rows(written, n_head, n_head_kv), hf)
            if rows > 2 * n_head:
                self.assertFalse(np.array_equal(written, hf))


class DpoTerms(unittest.TestCase):
    def test_loss_and_margin_as_the_dpo_paper_and_trl_write_them(self) -> None:
        import math

        import torch

        # Log-probabilities (preferred, non-preferred) of two examples under the trained and the reference model.
        policy = torch.tensor([[-1.0, -5.0], [-4.0, -2.0]])
        reference = torch.tensor([[-2.0, -3.0], [-4.0, -2.0]])
        loss, margin = worker.dpo_terms(0.5, policy, reference)
        # margin = beta * ((pi_c - ref_c) - (pi_r - ref_r)): 0.5 * ((1) - (-2)) = 1.5; the second is at the reference.
        self.assertEqual(margin.tolist(), [1.5, 0.0])
        self.assertAlmostEqual(loss[0].item(), math.log1p(math.exp(-1.5)), places=6)
        self.assertAlmostEqual(loss[1].item(), math.log(2), places=6)


class Best(unittest.TestCase):
    def test_serves_the_lowest_eval_loss_as_conduit_does(self) -> None:
        with open(os.path.join(os.path.dirname(__file__), "best_cases.json"), encoding="utf8") as f:
            cases = json.load(f)["cases"]
        for case in cases:
            with self.subTest(case["name"]):
                tracker = worker.BestTracker(patience=case["patience"])
                kept = [tracker.observe(loss, epoch, step) for loss, epoch, step in case["evals"]]
                self.assertEqual(tracker.best, case["best"])
                self.assertEqual(tracker.evals_since_best, case["evalsSinceBest"])
                self.assertEqual(tracker.stopped, case["stopped"])
                # The weights kept last are the served ones.
                last_kept = max(i for i, k in enumerate(kept) if k)
                self.assertEqual(case["evals"][last_kept][2], case["best"]["step"])

    def test_state_round_trips(self) -> None:
        tracker = worker.BestTracker(patience=None)
        tracker.observe(2.0, 1, 5)
        again = worker.BestTracker(patience=None, state=tracker.state())
        self.assertEqual((again.best, again.lowest, again.evals_since_best), (tracker.best, tracker.lowest, 0))


class ThreadTuning(unittest.TestCase):
    def test_shared_cases(self) -> None:
        with open(os.path.join(os.path.dirname(__file__), "thread_tuner_cases.json"), encoding="utf8") as f:
            cases = json.load(f)["cases"]
        for case in cases:
            with self.subTest(case["name"]):
                options = case["options"]
                tuner = worker.ThreadTuner(
                    case["candidates"],
                    trial_steps=options.get("trialSteps", 3),
                    settle_steps=options.get("settleSteps", 40),
                    slowdown=options.get("slowdown", 1.5),
                )
                times = [phase["seconds"] for phase in case["phases"] for _ in range(phase["steps"])]
                used: list[int] = []
                lines: list[str] = []
                for step, seconds in enumerate(times):
                    threads = tuner.threads()
                    used.append(threads)
                    line = tuner.observe(case["firstStep"] if step == 0 else seconds[str(threads)])
                    if line:
                        lines.append(line)
                self.assertEqual(used, case["used"])
                self.assertEqual(lines, case["lines"])


class Names(unittest.TestCase):
    def test_llama_cpp_weights_map_to_transformers_modules(self) -> None:
        self.assertEqual(worker.module_for("blk.3.attn_q.weight"), "layers.3.self_attn.q_proj")
        self.assertEqual(worker.module_for("blk.0.ffn_down.weight"), "layers.0.mlp.down_proj")
        self.assertEqual(worker.module_for("output.weight"), "lm_head")
        with self.assertRaises(ValueError):
            worker.module_for("blk.0.ssm_in.weight")

    def test_job_paths_are_relative_to_the_job_file(self) -> None:
        job = {"baseModelPath": "../m.gguf", "train": {"file": "t.windows"}, "lora": {"rank": 4}, "probe": None}
        resolved = worker.resolve_paths(job, "/jobs/a")
        self.assertEqual(resolved["baseModelPath"], "/jobs/a/../m.gguf")
        self.assertEqual(resolved["train"]["file"], "/jobs/a/t.windows")
        self.assertEqual(resolved["lora"], {"rank": 4})
        self.assertEqual(worker.resolve_paths({"file": "/abs"}, "/x"), {"file": "/abs"})


class Windows(unittest.TestCase):
    def test_reads_the_records_conduit_writes(self) -> None:
        import tempfile

        size = 8
        layout = [("sampleTokens", "<i4"), ("input", "<i4", (size,)), ("labels", "<i4", (size,)), ("mask", "u1", (size,))]
        record = np.zeros(1, dtype=np.dtype(layout))
        record["sampleTokens"] = 5
        record["input"][0, :5] = [1, 2, 3, 4, 5]
        record["mask"][0, 2:5] = 1
        with tempfile.NamedTemporaryFile(suffix=".windows", delete=False) as f:
            f.write(record.tobytes() * 3)
        windows = worker.Windows(f.name, size)
        self.assertEqual(len(windows), 3)
        self.assertEqual(int(windows[2]["sampleTokens"]), 5)
        self.assertEqual(list(np.flatnonzero(windows[1]["mask"])), [2, 3, 4])
        with open(f.name, "ab") as g:
            g.write(b"x")
        with self.assertRaises(ValueError):
            worker.Windows(f.name, size)
        os.unlink(f.name)


class Steps(unittest.TestCase):
    def test_a_step_takes_its_windows_and_stops_at_epoch_ends_and_evaluations(self) -> None:
        self.assertEqual(worker.group_end(0, 4, 10, set()), 4)
        self.assertEqual(worker.group_end(8, 4, 10, set()), 10)  # the epoch ends first
        self.assertEqual(worker.group_end(4, 4, 10, {6, 10}), 6)  # evaluated after window 6
        self.assertEqual(worker.group_end(6, 4, 10, {6, 10}), 10)
        self.assertEqual(worker.group_end(3, 1, 10, {4}), 4)

    def test_the_ranks_share_a_step_without_overlap(self) -> None:
        shards = [list(worker.shard(10, 15, 2, rank)) for rank in range(2)]
        self.assertEqual(shards, [[10, 12, 14], [11, 13]])
        self.assertEqual(list(worker.shard(14, 15, 2, 1)), [])  # a rank with no window adds zero gradients

    def test_ranks_come_from_torchrun_s_environment(self) -> None:
        alone = worker.Ranks({})
        self.assertEqual((alone.world, alone.rank, alone.leader, alone.distributed), (1, 0, True, False))
        second = worker.Ranks({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
        self.assertEqual((second.world, second.rank, second.local_rank, second.local_world), (4, 3, 1, 2))
        self.assertFalse(second.leader)
        self.assertTrue(second.distributed)
        self.assertEqual(second.machines, 2)

    def test_a_rank_on_another_machine_gets_the_job_and_its_windows(self) -> None:
        import tempfile

        with tempfile.TemporaryDirectory() as here, tempfile.TemporaryDirectory() as there:
            train = os.path.join(here, "train.windows")
            with open(train, "wb") as f:
                f.write(b"windows")
            job = {
                "train": {"file": train},
                "eval": None,
                "examples": [{"file": "x"}],
                "lossesFile": "l",
                "checkpointDir": "c",
                "probe": {"tokens": [1]},
                "adapterFile": "a",
                "seed": 7,
            }
            got = worker.receive_job(worker.job_bundle(job), there)
            with open(got["train"]["file"], "rb") as f:
                self.assertEqual(f.read(), b"windows")
            self.assertTrue(got["train"]["file"].startswith(there))
            self.assertEqual((got["eval"], got["examples"], got["lossesFile"], got["probe"]), (None, [], None, None))
            self.assertEqual(got["seed"], 7)
            self.assertEqual(job["train"]["file"], train)  # the leader's job is left as it was

    def test_a_quiet_channel_sends_only_errors(self) -> None:
        import io

        channel = worker.Channel(quiet=True)
        channel.out = io.StringIO()
        channel.log("hidden")
        channel.send({"type": "progress", "step": 1})
        channel.send({"type": "error", "message": "trainer: rank 1 of 2: boom"})
        self.assertEqual(channel.out.getvalue().count("\n"), 1)
        self.assertIn("rank 1 of 2", channel.out.getvalue())


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(os.environ.get("CONDUIT_GGML_LIBRARY"), "CONDUIT_GGML_LIBRARY (node-llama-cpp's libggml-base) not set")
class NativeDequantizer(unittest.TestCase):
    """ggml's dequantization gives what gguf-py's does, on the block types real bases use."""

    def blocks(self, qtype: "object", rows: int, row_blocks: int, scale_offsets: list[int]) -> "np.ndarray":
        import gguf

        _, size = gguf.GGML_QUANT_SIZES[qtype]
        rng = np.random.default_rng(7)
        data = rng.integers(0, 256, size=(rows, row_blocks, size), dtype=np.uint8)
        for offset in scale_offsets:  # finite fp16 scales (random bits would make NaNs and infinities)
            scale = rng.uniform(-0.05, 0.05, size=(rows, row_blocks)).astype(np.float16)
            data[:, :, offset : offset + 2] = scale.view(np.uint8).reshape(rows, row_blocks, 2)
        return data.reshape(rows, row_blocks * size)

    def test_equals_gguf_py(self) -> None:
        import gguf

        native = worker.native_dequantizer(os.environ["CONDUIT_GGML_LIBRARY"], 2)
        Q = gguf.GGMLQuantizationType
        cases = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q8_0: [0], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
        for qtype, offsets in cases.items():
            with self.subTest(qtype.name):
                data = self.blocks(qtype, rows=5, row_blocks=3, scale_offsets=offsets)
                expected = gguf.quants.dequantize(data, qtype)
                got = native(data, qtype)
                self.assertEqual(got.shape, expected.shape)
                np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        # F16 is not a quantized type: gguf-py's own path.
        half = np.arange(6, dtype=np.float16).reshape(2, 3)
        np.testing.assert_array_equal(native(half.view(np.uint8), Q.F16), half.astype(np.float32))


class KeepEpoch(unittest.TestCase):
    def test_keeps_the_last_three_epochs_raw_with_their_json(self) -> None:
        import json
        import tempfile

        class Writes:
            def write_adapter(self, path: str) -> int:
                with open(path, "wb") as f:
                    f.write(b"\0" * 8)
                return 8

        with tempfile.TemporaryDirectory() as directory:
            for epoch in range(1, 6):
                worker.Trainer.keep_epoch(Writes(), directory, {"step": 10 * epoch, "epoch": epoch, "trainLoss": 1.0})
            kept = os.path.join(directory, worker.KEPT_DIR)
            self.assertEqual(
                sorted(os.listdir(kept)),
                sorted(f"step-{s}.{ext}" for s in (30, 40, 50) for ext in ("f32", "json")),
            )
            with open(os.path.join(kept, "step-50.json"), encoding="utf8") as f:
                self.assertEqual(json.load(f), {"step": 50, "epoch": 5, "trainLoss": 1.0})
