/** Which trainer a run gets (`chooseTrainer`): a table of settings, installs and runs. No server, no model. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { chooseTrainer, type TrainerChoiceInput } from "../../src/train/trainerChoice.ts";
import type { TorchStatus } from "../../src/train/torch/torchStatus.ts";

const installed: TorchStatus = {
  available: true,
  python: "/venv/bin/python",
  probe: {
    python: "3.11.7",
    torch: "2.13.0+cpu",
    transformers: "5.24.0",
    peft: "0.21.2",
    gguf: "0.19.0",
    cuda: false,
    cudaDevice: null,
    bf16: true,
  },
};
const missing: TorchStatus = { available: false, python: null, reason: "no venv" };

test("chooseTrainer: the setting, the install and the run decide; what nothing can train is a 400 with the reason", () => {
  const run = (over: Partial<TrainerChoiceInput>) =>
    chooseTrainer({
      setting: "auto",
      torch: installed,
      method: "lora",
      architecture: "llama",
      targets: undefined,
      ...over,
    });
  const cases: [Partial<TrainerChoiceInput>, string | RegExp, RegExp][] = [
    // [input, trainer or refusal, reason / message]
    [{}, "torch", /auto: it is installed.*PyTorch 2\.13\.0\+cpu \+ PEFT 0\.21\.2 on the CPU, bf16/],
    [{ torch: missing }, "llama.cpp", /auto: no torch trainer here \(npm run setup:torch adds one\)/],
    [{ method: "full" }, "llama.cpp", /auto: the torch trainer trains LoRA adapters only/],
    [{ setting: "llama.cpp" }, "llama.cpp", /CONDUIT_TRAINER/],
    [{ setting: "torch" }, "torch", /torch \(CONDUIT_TRAINER\)/],
    [{ architecture: "gemma3" }, "torch", /auto: it is installed/],
    [{ targets: ["attn_q", "attn_k"] }, "torch", /auto/],
    [
      { targets: ["attn_q", "attn_k"], torch: missing },
      /param:loraTargets/,
      /cannot train "attn_k".*KV cache.*torch trainer is not available: no venv/,
    ],
    [
      { architecture: "gemma3", torch: missing },
      /param:baseModelName/,
      /cannot train gemma3 models: .*GEGLU.*torch trainer is not available/,
    ],
    [
      { architecture: "gemma3", setting: "llama.cpp" },
      /param:baseModelName/,
      /GEGLU.*CONDUIT_TRAINER is llama\.cpp; the torch trainer can: npm run setup:torch/,
    ],
    [{ architecture: "gemma3", method: "full" }, /param:baseModelName/, /GEGLU.*LoRA adapters only/],
    [
      { setting: "torch", torch: missing },
      /param:baseModelName/,
      /torch trainer is not available: no venv \(CONDUIT_TRAINER is torch\)/,
    ],
    [{ setting: "torch", method: "full" }, /param:method/, /LoRA adapters only/],
  ];
  for (const [over, expected, message] of cases) {
    const label: string = JSON.stringify({ ...over, torch: over.torch === missing ? "missing" : undefined });
    if (typeof expected === "string") {
      const choice = run(over);
      assert.equal(choice.trainer, expected, label);
      assert.match(choice.reason, message, label);
    } else
      assert.throws(
        () => run(over),
        (error: Error & { param?: string; statusCode?: number }) => {
          assert.match(`param:${error.param}`, expected, label);
          assert.match(error.message, /^no trainer here can train this run: /, label);
          assert.match(error.message, message, label);
          return true;
        },
      );
  }
});
