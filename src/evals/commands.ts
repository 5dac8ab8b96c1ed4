/**
 * What the eval service is asked to do, in its own terms: each API face (the Conduit API's `POST /conduit/evals`,
 * the OpenAI face's `POST /v1/evals`) maps its body into these and maps the service's errors (whose `param` names
 * a field of the command, `graders[1].pattern`) back to its own fields.
 */
import type { GraderSpec } from "../contract/evals.ts";
import type { EvalConfig, EvalRunConfig, EvalSource, ResolvedItem } from "../domain/evals.ts";

/** Create an eval: its graders and where its items come from. */
export interface CreateEval {
  /** Defaults to `eval`. */
  name?: string | undefined;
  /** The graders as asked; the service checks each, fills in its defaults and settles its name. */
  graders: readonly GraderSpec[];
  /** Where its items come from. Defaults to none: each run names its items. */
  source?: EvalSource | undefined;
  /** Opens every prompt (a fine-tune's own system prompt wins for it). Defaults to none. */
  systemPrompt?: string | undefined;
  /** The fine-tuning run it is made for (the automatic before/after). Defaults to none. */
  runId?: string | undefined;
  /** What a compatibility face was asked, kept to be returned as it was sent. Defaults to none. */
  faceRequest?: EvalConfig["faceRequest"];
}

/** Score models on every item of an eval. */
export interface CreateEvalRun {
  /** Base model names, run ids or `ft:` names of the user's; each answers every item. */
  models: readonly string[];
  /** Defaults to `<eval name> on <models>`. */
  name?: string | undefined;
  /** Its items, when the eval has none of its own or these replace them. Defaults to the eval's source. */
  source?: EvalSource | undefined;
  /** Items already resolved by the face (OpenAI's data sources); replace `source`. Defaults to none. */
  items?: ResolvedItem[] | undefined;
  /** Most tokens of each answer. Defaults to `evalDefaults.maxTokens`. */
  maxTokens?: number | undefined;
  /** Answers in flight at once. Defaults to the service's `parallel` (`CONDUIT_EVAL_PARALLEL`). */
  parallel?: number | undefined;
  /** What a compatibility face was asked, kept to be returned as it was sent. Defaults to none. */
  faceRequest?: EvalRunConfig["faceRequest"];
}
