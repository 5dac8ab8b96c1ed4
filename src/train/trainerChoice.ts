/**
 * Which trainer trains a run, decided when the run is created and kept in its `config.trainer`: the one the run
 * asks for (its `trainer`), else the setting (`CONDUIT_TRAINER`); which trainers are installed, and what the run needs (each trainer's `cannotTrain`: the
 * method, the architecture, the LoRA targets). A run no trainer here can train is refused at creation with the
 * reason, never queued to fail later.
 */
import { ConduitError } from "../errors.ts";
import type { TrainerName, TrainerSetting } from "../domain/runs.ts";
import type { Refusal, TrainerBackend, TrainerStatus, TrainingRequest } from "./core/TrainerBackend.ts";
import { trainersInOrder } from "./trainers.ts";

export interface TrainerChoiceInput {
  setting: TrainerSetting;
  /** The trainer the run asks for (its `trainer`); it overrides the setting. Defaults to none. */
  asked?: TrainerName | undefined;
  request: TrainingRequest;
  /** The status of each trainer that may be chosen: the one the setting names, or every one with `auto`. */
  statuses: Partial<Record<TrainerName, TrainerStatus>>;
}

export interface TrainerChoice {
  trainer: TrainerName;
  /** One sentence for the run's log: which trainer, and why. */
  reason: string;
}

/**
 * Picks the run's trainer, or throws a 400 naming what stands in the way and what would help. With `auto`, the
 * first of `backends` (the registry's order) that is available and can train the run gets it.
 */
export function chooseTrainer(
  { setting, asked, request, statuses }: TrainerChoiceInput,
  backends: readonly TrainerBackend[] = trainersInOrder(),
): TrainerChoice {
  const statusOf = (backend: TrainerBackend): TrainerStatus =>
    statuses[backend.name] ?? { available: false, reason: "its status was not checked" };
  /** Why a trainer cannot train this run here (it cannot train it, or it is not installed), or undefined. */
  const refusal = (backend: TrainerBackend): Refusal | undefined => {
    const cannot = backend.cannotTrain(request);
    if (cannot !== undefined) return cannot;
    const status = statusOf(backend);
    return status.available
      ? undefined
      : { param: "baseModelName", why: `the ${backend.name} trainer is not available: ${status.reason}` };
  };
  const detail = (backend: TrainerBackend) => {
    const status = statusOf(backend);
    return status.available && status.detail !== undefined ? `, ${status.detail}` : "";
  };

  if (asked !== undefined) {
    const backend = backends.find((candidate) => candidate.name === asked);
    if (backend === undefined)
      throw new ConduitError("invalid_request", `no trainer named "${asked}" here`, { param: "trainer" });
    const refused = refusal(backend);
    if (refused !== undefined) {
      const others = backends
        .filter((other) => other !== backend && other.cannotTrain(request) === undefined)
        .map((other) => other.name);
      throw new ConduitError(
        "invalid_request",
        `"trainer" is ${asked}, which cannot train this run: ${refused.why}` +
          (others.length > 0
            ? `; ${others.map((name) => `"${name}"`).join(" or ")} can, or leave "trainer" out`
            : ""),
        { param: "trainer" },
      );
    }
    return {
      trainer: backend.name,
      reason: `trainer: ${backend.name} (the run's "trainer")${detail(backend)}`,
    };
  }

  if (setting !== "auto") {
    const backend = backends.find((candidate) => candidate.name === setting);
    if (backend === undefined) throw new Error(`no trainer named ${setting}`);
    const refused = refusal(backend);
    if (refused !== undefined) {
      // Which other trainer would train it, and what it takes.
      const others = backends
        .filter((other) => other !== backend && other.cannotTrain(request) === undefined)
        .map(
          (other) =>
            `; the ${other.name} trainer can: ` +
            `${other.setupCommand === null ? "" : `${other.setupCommand}, then `}CONDUIT_TRAINER=auto`,
        );
      throw refuse([{ ...refused, why: `${refused.why} (CONDUIT_TRAINER is ${setting}${others.join("")})` }]);
    }
    return { trainer: backend.name, reason: `trainer: ${backend.name} (CONDUIT_TRAINER)${detail(backend)}` };
  }

  const passedOver: string[] = [];
  const refusals: Refusal[] = [];
  for (const [index, backend] of backends.entries()) {
    const refused = refusal(backend);
    if (refused === undefined)
      return {
        trainer: backend.name,
        reason:
          index === 0
            ? `trainer: ${backend.name} (auto: it is installed)${detail(backend)}`
            : `trainer: ${backend.name} (auto: ${passedOver.join("; ")})${detail(backend)}`,
      };
    refusals.push(refused);
    passedOver.push(
      backend.cannotTrain(request) === undefined && backend.setupCommand !== null
        ? `no ${backend.name} trainer here (${backend.setupCommand} adds one)`
        : refused.why,
    );
  }
  // The last resort's reason first: the trainer that ships with Conduit says what to change in the run.
  throw refuse(refusals.reverse());
}

function refuse(refusals: readonly Refusal[]): ConduitError {
  return new ConduitError(
    "invalid_request",
    `no trainer here can train this run: ${refusals.map((refusal) => refusal.why).join("; ")}`,
    { param: refusals[0]?.param ?? "baseModelName" },
  );
}
