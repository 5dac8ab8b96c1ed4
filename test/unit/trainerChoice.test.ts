/** Which trainer a run gets (`chooseTrainer`): a table of settings, installs and runs. No server, no model. */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { TrainerStatus } from "../../src/train/core/TrainerBackend.ts";
import { chooseTrainer } from "../../src/train/trainerChoice.ts";
import { trainers } from "../../src/train/trainers.ts";
import { describeTorch } from "../../src/train/torch/torchStatus.ts";
import type { TrainMethod } from "../../src/contract/runs.ts";
import type { TrainObjective } from "../../src/domain/runs.ts";
import type { TrainerSetting } from "../../src/domain/runs.ts";

const installed: TrainerStatus = {
  available: true,
  detail: describeTorch({
    python: "3.11.7",
    torch: "2.13.0+cpu",
    transformers: "5.24.0",
    peft: "0.21.2",
    gguf: "0.19.0",
    cuda: false,
    cudaDevice: null,
    bf16: true,
  }),
};
const missing: TrainerStatus = { available: false, reason: "no venv" };

/** A case: the setting, the torch trainer's status, and what the run asks for. */
interface Case {
  setting: TrainerSetting;
  torch: TrainerStatus;
  method: TrainMethod;
  objective: TrainObjective;
  architecture: string;
  targets: ("attn_q" | "attn_k")[] | undefined;
}

test("every trainer is registered under its own name", () => {
  for (const [name, backend] of Object.entries(trainers)) assert.equal(backend.name, name);
});

test("chooseTrainer: the setting, the install and the run decide; what nothing can train is a 400 with the reason", () => {
  const run = (over: Partial<Case>) => {
    const { setting, torch, method, objective, architecture, targets }: Case = {
      setting: "auto",
      torch: installed,
      method: "lora",
      objective: "sft",
      architecture: "llama",
      targets: undefined,
      ...over,
    };
    return chooseTrainer(
      {
        setting,
        request: { method, objective, architecture, loraTargets: targets },
        statuses: { torch, "llama.cpp": { available: true } },
      },
      [trainers.torch, trainers["llama.cpp"]],
    );
  };
  const cases: [Partial<Case>, string | RegExp, RegExp][] = [
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
      /torch trainer is not available: no venv \(CONDUIT_TRAINER is torch; the llama\.cpp trainer can: CONDUIT_TRAINER=auto\)/,
    ],
    [
      { setting: "torch", method: "full" },
      /param:method/,
      /LoRA adapters only .*CONDUIT_TRAINER is torch; the llama\.cpp trainer can: CONDUIT_TRAINER=auto\)/,
    ],
    // Preference tuning is the torch trainer's alone.
    [{ objective: "dpo" }, "torch", /auto: it is installed/],
    [
      { objective: "dpo", torch: missing },
      /param:method/,
      /llama\.cpp trainer cannot do preference tuning \("method": "dpo"\).*torch trainer is not available: no venv/,
    ],
    [
      { objective: "dpo", setting: "llama.cpp" },
      /param:method/,
      /preference tuning.*CONDUIT_TRAINER is llama\.cpp; the torch trainer can: npm run setup:torch/,
    ],
    // llama.cpp trains full runs, the torch trainer does not: nothing here trains a full run of Gemma 3.
    [
      { architecture: "gemma3", method: "full", setting: "llama.cpp" },
      /param:baseModelName/,
      /GEGLU.* \(CONDUIT_TRAINER is llama\.cpp\)$/,
    ],
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

test("chooseTrainer: a run that names its trainer gets it, whatever the setting; one that cannot is a 400 on trainer", () => {
  const choose = (
    asked: "torch" | "llama.cpp",
    setting: TrainerSetting,
    torch: TrainerStatus,
    method: TrainMethod,
  ) =>
    chooseTrainer(
      {
        setting,
        asked,
        request: { method, objective: "sft", architecture: "llama", loraTargets: undefined },
        statuses: { torch, "llama.cpp": { available: true } },
      },
      [trainers.torch, trainers["llama.cpp"]],
    );
  const named = choose("llama.cpp", "torch", installed, "lora");
  assert.equal(named.trainer, "llama.cpp");
  assert.match(named.reason, /the run's "trainer"/);
  assert.equal(choose("torch", "llama.cpp", installed, "lora").trainer, "torch");
  for (const [torch, method, message] of [
    [
      missing,
      "lora",
      /"trainer" is torch, which cannot train this run: the torch trainer is not available: no venv; "llama\.cpp" can/,
    ],
    [
      installed,
      "full",
      /"trainer" is torch, which cannot train this run: the torch trainer trains LoRA adapters only/,
    ],
  ] as const)
    assert.throws(
      () => choose("torch", "auto", torch, method),
      (error: { code?: string; param?: string; message: string }) =>
        error.code === "invalid_request" && error.param === "trainer" && message.test(error.message),
    );
});
