import type { Run } from "./runs.ts";

/**
 * The name a READY run is served under. A run created through OpenAI's fine-tuning API
 * (`config.jobRequest`) is `ft:{base model}:{suffix}:{run id}` (the suffix may be empty), as OpenAI names
 * fine-tuned models; any other run is its id. The run id works as a model name either way.
 */
export function servedModelName(run: Pick<Run, "id" | "config">): string {
  const request = run.config.jobRequest;
  if (request?.face !== "openai") return run.id;
  const suffix = typeof request.suffix === "string" ? request.suffix : "";
  return `ft:${String(run.config.baseModelName)}:${suffix}:${run.id}`;
}

/** The run id in an `ft:` model name (its last `:` field), or `undefined` when the name is not one. */
export function runIdOfModelName(name: string): string | undefined {
  if (!name.startsWith("ft:")) return undefined;
  const id = name.slice(name.lastIndexOf(":") + 1);
  return id.startsWith("ft_") ? id : undefined;
}

const CHECKPOINT_SUFFIX = /^(.{1,300}):ckpt-step-([1-9][0-9]{0,8})$/;

/** The name a READY run's kept checkpoint is served under: the run's name and `:ckpt-step-<step>`, as OpenAI's. */
export function checkpointModelName(run: Pick<Run, "id" | "config">, step: number): string {
  return `${servedModelName(run)}:ckpt-step-${step}`;
}

/** The run's name (an id or an `ft:` name) and the step in a checkpoint's model name; `undefined` when not one. */
export function checkpointOfModelName(name: string): { runName: string; step: number } | undefined {
  const match = CHECKPOINT_SUFFIX.exec(name);
  return match ? { runName: match[1]!, step: Number(match[2]) } : undefined;
}
