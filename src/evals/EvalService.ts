import { EventEmitter } from "node:events";
import type { Logger } from "pino";
import type { DatasetService } from "../datasets/DatasetService.ts";
import type { IoPair } from "../datasets/ioPairs.ts";
import type { ModelRef, SamplingOptions } from "../engine/types.ts";
import { ConduitError } from "../errors.ts";
import type { InferenceService } from "../inference/InferenceService.ts";
import type { BlobStore } from "../store/BlobStore.ts";
import { DatabaseHealth } from "../store/DatabaseHealth.ts";
import type { Page } from "../store/DatasetRepository.ts";
import type { Eval, EvalItem, EvalResult, EvalRun, EvalSource, ResolvedItem } from "../domain/evals.ts";
import type { EvalRepository } from "../store/EvalRepository.ts";
import { newId } from "../store/ids.ts";
import type { Run, RunRepository } from "../store/RunRepository.ts";
import { fileLines } from "../train/exampleFiles.ts";
import type { RunEventBus } from "../train/runEvents.ts";
import {
  evalDefaults,
  evalLimits,
  type EvalGrader,
  type EvalRunProgress,
  type EvalRunStatus,
  type GraderScore,
  type GraderSpec,
  type JudgeUsage,
  type ModelGrader,
  type ModelTotals,
  type RunEvaluation,
} from "../contract/evals.ts";
import { grade, gradesInline, isModelGrader, settleGraders } from "./graders.ts";
import { judgePrompt, judgeSchema, readVerdict } from "./judge.ts";
import { GraderThread } from "./GraderThread.ts";
import { AFTER_RUN_JUDGE, describeEvaluation } from "./runEvaluation.ts";
import type { CreateEval, CreateEvalRun } from "./commands.ts";
import { EvalRunFeed, type EvalRunEvent } from "./EvalRunFeed.ts";

export type { EvalRunEvent } from "./EvalRunFeed.ts";

/** What happens to eval runs in this process: followers wake on `changed`. */
export interface EvalEvents {
  changed: [runId: string];
}

/** A RUNNING eval run not written for this long is taken for one whose server stopped (each writes every 2 s). */
const STALE_MS = 60_000;
/** How often a server answering a run writes its progress, even when no answer has come. */
const HEARTBEAT_MS = 2000;

const TERMINAL: readonly EvalRunStatus[] = ["COMPLETED", "FAILED", "CANCELLED"];

/** Greedy: the most likely token each time, no penalties, so that a model's answers are reproducible. */
function greedy(maxTokens: number): SamplingOptions {
  return { maxTokens, temperature: 0, topK: 1, topP: 1, presencePenalty: 0, frequencyPenalty: 0 };
}

/** Items the automatic before/after scores at most (the first of the split): its cost stays bounded. */
const AFTER_RUN_MAX_ITEMS = 200;

/** Graders of the automatic before/after of a fine-tuning run. */
const AFTER_RUN_GRADERS: GraderSpec[] = [{ type: "exact_match" }, { type: "similarity" }];

/** The before/after's grader for a run's `judgeModel`: the judge scores each answer against the expected one. */
function afterRunJudge(model: string): GraderSpec {
  return {
    type: "score_model",
    name: AFTER_RUN_JUDGE,
    model,
    input: [
      {
        role: "system",
        content:
          "You grade an assistant's answer against a reference answer. Score 1 when it says what the reference " +
          "says, 0 when it is wrong or unrelated, and in between for a partly right answer.",
      },
      {
        role: "user",
        content:
          "Question:\n{{item.input}}\n\nReference answer:\n{{item.expected}}\n\nAnswer to grade:\n{{sample.output_text}}",
      },
    ],
    range: [0, 1],
    passThreshold: 0.5,
  };
}

export interface EvalServiceOptions {
  /** Answers in flight at once when a run does not say (`CONDUIT_EVAL_PARALLEL`). Defaults to `8`. */
  parallel?: number;
  /** Scores base and fine-tune when a run with held-out pairs becomes READY (`CONDUIT_EVAL_AFTER_RUN`). Defaults to `true`. */
  afterRun?: boolean;
  /** Eval runs this process answers (0: none; another server does). Defaults to `1`. */
  concurrency?: number;
  /** How often the queue is checked for runs other servers queued. Defaults to `5000`. */
  pollMs?: number;
  /** How long one grader may take on one answer (a regex, a schema, a similarity). Defaults to `2000`. */
  gradeTimeoutMs?: number;
  /** How often a followed run is read for changes another server made. Defaults to `1000`. */
  followPollMs?: number;
  /**
   * The database's outages as this process sees them: results wait one out instead of failing the run, and
   * other servers' runs are judged stale only once the database has been back for {@link STALE_MS}. Defaults to
   * a tracker of the service's own.
   */
  health?: DatabaseHealth;
}

/**
 * Evaluations: evals (graders and where items come from), eval runs that score models on every item through the
 * one generation path (the engine batches `parallel` answers in flight), per-item results, cancel, and the
 * automatic before/after of a fine-tuning run.
 */
export class EvalService {
  readonly events = new EventEmitter<EvalEvents>();
  private readonly active = new Map<string, AbortController>();
  private draining: Promise<void> | undefined;
  private closed = false;
  private readonly pending = new Set<Promise<unknown>>();
  private readonly parallel: number;

  constructor(
    private readonly evals: EvalRepository,
    private readonly runRepository: RunRepository,
    private readonly datasets: DatasetService,
    private readonly inference: InferenceService,
    private readonly blobs: BlobStore,
    private readonly log: Logger,
    private readonly options: EvalServiceOptions = {},
  ) {
    this.events.setMaxListeners(0);
    this.parallel = options.parallel ?? 8;
    this.health = options.health ?? new DatabaseHealth();
    this.graderThread = new GraderThread({ timeoutMs: options.gradeTimeoutMs });
  }
  private readonly graderThread: GraderThread;
  private readonly health: DatabaseHealth;

  /** Starts answering queued eval runs, and (unless turned off) evaluating runs that become READY. */
  start(runEvents: RunEventBus): void {
    if ((this.options.concurrency ?? 1) <= 0) return;
    if (this.options.afterRun ?? true)
      runEvents.on("ended", (runId, status) => {
        if (status === "READY") this.track(this.evaluateRun(runId));
      });
    // Other servers sharing the database queue runs too, and one that stopped may have left one RUNNING.
    this.timer = setInterval(() => {
      // A run not written while the database was away says nothing of its server: none could write.
      const stale = this.health.upFor(STALE_MS)
        ? this.evals.failStale(new Date(Date.now() - STALE_MS), [...this.active.keys()])
        : Promise.resolve(0);
      stale.then(
        () => this.wake(),
        (error: unknown) => {
          if (!this.health.saw(error)) this.log.error({ err: error }, "eval queue check failed");
        },
      );
    }, this.options.pollMs ?? 5000);
    this.timer.unref();
    this.wake();
  }
  private timer: NodeJS.Timeout | undefined;

  private track(work: Promise<unknown>): void {
    const tracked = work.catch((error: unknown) => this.log.error({ err: error }, "eval work failed"));
    this.pending.add(tracked);
    void tracked.finally(() => this.pending.delete(tracked));
  }

  /** Answers queued eval runs one after another until none is left. */
  private wake(): void {
    if (this.closed || (this.options.concurrency ?? 1) <= 0) return;
    if (this.draining) {
      this.wakeAgain = true;
      return;
    }
    this.draining = (async () => {
      do {
        this.wakeAgain = false;
        for (let run = await this.evals.claimNext(); run && !this.closed; run = await this.evals.claimNext())
          await this.execute(run);
      } while (this.wakeAgain && !this.closed);
    })()
      .catch((error: unknown) => {
        // The database away: the queue check wakes the runner again once it is back.
        if (!this.health.saw(error)) this.log.error({ err: error }, "eval runner failed");
      })
      .finally(() => (this.draining = undefined));
  }
  private wakeAgain = false;

  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.timer);
    for (const controller of this.active.values())
      controller.abort(new ConduitError("unavailable", "the server is shutting down"));
    await this.draining;
    await Promise.all(this.pending);
    await this.graderThread.dispose();
  }

  // --- evals ---

  async create(userId: string, command: CreateEval): Promise<Eval> {
    const graders = settleGraders(command.graders);
    // A judge must be a model this user can name now: a typo is a 400 here, not an error on every item later.
    for (const [i, grader] of graders.entries())
      if (isModelGrader(grader))
        await this.inference.resolve(userId, grader.model, `graders[${i}].model`).catch((error: unknown) => {
          if (error instanceof ConduitError && error.code === "model_not_found")
            throw new ConduitError("invalid_request", error.message.replace(/^model/, "judge model"), {
              param: error.param,
            });
          throw error;
        });
    // The source is checked now (a file or run of someone else is a 404 here, not when a run starts).
    const source = command.source ?? null;
    if (source && source.type !== "items") await this.resolveItems(userId, source, "source");
    return this.evals.create({
      id: newId("eval"),
      userId,
      name: command.name ?? "eval",
      config: {
        graders,
        source,
        systemPrompt: command.systemPrompt ?? "",
        ...(command.faceRequest ? { faceRequest: command.faceRequest } : {}),
      },
      runId: command.runId ?? null,
    });
  }

  async get(userId: string, id: string): Promise<Eval> {
    const found = await this.evals.get(userId, id);
    if (!found) throw new ConduitError("not_found", `eval ${id} not found`, { param: "evalId" });
    return found;
  }

  list(
    userId: string,
    page: Page | { limit: number; after?: string | undefined; order?: "asc" | "desc" },
  ): Promise<Eval[]> {
    return this.evals.list(userId, page);
  }

  async rename(
    userId: string,
    id: string,
    name: string,
    metadata?: Record<string, string> | null,
  ): Promise<Eval> {
    const found = await this.evals.rename(userId, id, name, metadata);
    if (!found) throw new ConduitError("not_found", `eval ${id} not found`, { param: "evalId" });
    return found;
  }

  /** Deletes an eval with its runs; a run in progress is cancelled first. */
  async delete(userId: string, id: string): Promise<void> {
    for (const run of await this.evals.listRuns(userId, id, { limit: 1000 }))
      if (run.status === "QUEUED" || run.status === "RUNNING") await this.cancel(userId, id, run.id);
    if (!(await this.evals.delete(userId, id)))
      throw new ConduitError("not_found", `eval ${id} not found`, { param: "evalId" });
  }

  // --- items ---

  /** The items of a source, read now (a file or run of another user is a 404 naming `param`). */
  async resolveItems(userId: string, source: EvalSource, param: string): Promise<ResolvedItem[]> {
    let items: ResolvedItem[];
    if (source.type === "items") items = source.items.map((item, i) => itemOf(item, `${param}.items[${i}]`));
    else if (source.type === "file")
      items = await collect(this.datasets.filePairs(userId, source.fileId, param), pairItem, param);
    else {
      const run = await this.runRepository.get(userId, source.runId);
      if (!run)
        throw new ConduitError("not_found", `run ${source.runId} not found`, { param: `${param}.runId` });
      items = await this.heldOut(run, `${param}.runId`);
    }
    if (items.length === 0)
      throw new ConduitError("invalid_request", `the items of "${param}" are none`, { param });
    if (items.length > evalLimits.maxItems)
      throw new ConduitError(
        "invalid_request",
        `"${param}" has ${items.length} items; an eval run takes at most ${evalLimits.maxItems}`,
        { param },
      );
    return items;
  }

  /**
   * A READY run's eval split: its validation file's pairs (whole conversations), else the pairs it held out (their
   * last user turn and answer, from its examples). A run without either is a 409.
   */
  private async heldOut(run: Run, param: string): Promise<ResolvedItem[]> {
    if (run.status !== "READY")
      throw new ConduitError(
        "conflict",
        `run ${run.id} is ${run.status}; its held-out pairs are known once it is READY`,
        {
          param,
        },
      );
    if (run.config.validationFileID)
      return collect(
        this.datasets.filePairs(run.userId, run.config.validationFileID, param),
        pairItem,
        param,
      );
    const items: ResolvedItem[] = [];
    try {
      for await (const line of fileLines(this.blobs.pathOf(`runs/${run.id}/examples.jsonl`))) {
        const example = JSON.parse(line) as { split: string; input: string; output: string };
        if (example.split === "validation")
          items.push({ messages: [{ role: "user", content: example.input }], expected: example.output });
      }
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    }
    if (items.length === 0)
      throw new ConduitError(
        "conflict",
        `run ${run.id} has no eval split: it had no validation file and too few pairs to hold some out`,
        { param },
      );
    return items;
  }

  // --- eval runs ---

  async createRun(userId: string, evalId: string, command: CreateEvalRun): Promise<EvalRun> {
    const found = await this.get(userId, evalId);
    // Each model must be one this user can name: another user's fine-tune is a 404, as on the chat route.
    for (const [i, model] of command.models.entries())
      await this.inference.resolve(userId, model, `models[${i}]`);
    const source = command.source ?? found.config.source;
    let items = command.items;
    if (!items) {
      if (!source)
        throw new ConduitError("invalid_request", `eval ${evalId} has no items of its own; send "source"`, {
          param: "source",
        });
      items = await this.resolveItems(userId, source, "source");
    }
    const run = await this.evals.createRun({
      id: newId("evalrun"),
      evalId,
      userId,
      name: command.name ?? `${found.name} on ${command.models.join(", ")}`,
      models: [...command.models],
      items,
      config: {
        graders: found.config.graders,
        systemPrompt: found.config.systemPrompt,
        maxTokens: command.maxTokens ?? evalDefaults.maxTokens,
        parallel: command.parallel ?? this.parallel,
        ...(command.faceRequest ? { faceRequest: command.faceRequest } : {}),
      },
      progress: { completed: 0, total: items.length * command.models.length, model: null },
    });
    this.wake();
    return run;
  }

  async getRun(userId: string, evalId: string, id: string): Promise<EvalRun> {
    const run = await this.evals.getRun(userId, evalId, id);
    if (!run) throw new ConduitError("not_found", `eval run ${id} not found`, { param: "evalRunId" });
    return run;
  }

  async listRuns(
    userId: string,
    evalId: string,
    page: { limit: number; after?: string | undefined; order?: "asc" | "desc" },
  ): Promise<EvalRun[]> {
    await this.get(userId, evalId);
    return this.evals.listRuns(userId, evalId, page);
  }

  /** Cancels a QUEUED or RUNNING eval run; one that ended is a 409. Returns the run as it is now. */
  async cancel(userId: string, evalId: string, id: string): Promise<EvalRun> {
    const previous = await this.evals.cancelRun(userId, evalId, id);
    if (previous === undefined)
      throw new ConduitError("not_found", `eval run ${id} not found`, { param: "evalRunId" });
    if (TERMINAL.includes(previous))
      throw new ConduitError("conflict", `eval run ${id} is ${previous} and cannot be cancelled`);
    this.active.get(id)?.abort(new ConduitError("conflict", "cancelled"));
    this.events.emit("changed", id);
    return this.getRun(userId, evalId, id);
  }

  async deleteRun(userId: string, evalId: string, id: string): Promise<void> {
    const run = await this.getRun(userId, evalId, id);
    if (run.status === "QUEUED" || run.status === "RUNNING") await this.cancel(userId, evalId, id);
    await this.evals.deleteRun(userId, evalId, id);
  }

  /**
   * A run's per-item results, by model then item (`model` keeps one model's), and how many there are in all (the
   * items answered so far, of `model` when given).
   */
  async results(
    userId: string,
    evalId: string,
    id: string,
    page: { limit: number; offset: number; model?: string | undefined },
  ): Promise<{ run: EvalRun; results: EvalResult[]; total: number }> {
    const run = await this.getRun(userId, evalId, id);
    let modelIndex: number | undefined;
    if (page.model !== undefined) {
      modelIndex = run.models.indexOf(page.model);
      if (modelIndex < 0)
        throw new ConduitError(
          "invalid_request",
          `model "${page.model}" is not one of this run's (${run.models.join(", ")})`,
          {
            param: "model",
          },
        );
    }
    return {
      run,
      results: await this.evals.results(id, { limit: page.limit, offset: page.offset, modelIndex }),
      total: await this.evals.countResults(id, modelIndex),
    };
  }

  async result(userId: string, evalId: string, id: string, modelIndex: number, itemIndex: number) {
    const run = await this.getRun(userId, evalId, id);
    const result = await this.evals.result(id, modelIndex, itemIndex);
    if (!result) throw new ConduitError("not_found", `output item not found`, { param: "output_item_id" });
    return { run, result };
  }

  /**
   * Follows an eval run: a `progress` event when its progress changes, a `status` event when its status does, until
   * it has ended. Another user's run is a 404 before any event. Every follower of a run shares one feed: a change
   * is read once, and its events are the same objects for all.
   */
  async follow(
    userId: string,
    evalId: string,
    id: string,
    signal?: AbortSignal,
  ): Promise<AsyncGenerator<EvalRunEvent>> {
    await this.getRun(userId, evalId, id);
    let feed = this.feeds.get(id);
    if (!feed) {
      const events = this.events;
      const created: EvalRunFeed = new EvalRunFeed(
        {
          read: () => this.evals.runState(userId, evalId, id),
          subscribe(wake) {
            const onChanged = (changed: string) => {
              if (changed === id) wake();
            };
            events.on("changed", onChanged);
            return () => events.off("changed", onChanged);
          },
        },
        () => {
          if (this.feeds.get(id) === created) this.feeds.delete(id);
        },
        this.options.followPollMs,
      );
      this.feeds.set(id, (feed = created));
    }
    return feed.follow(signal);
  }
  private readonly feeds = new Map<string, EvalRunFeed>();

  /** Answers every item with every model of a claimed (RUNNING) run, scoring and storing as it goes. */
  private async execute(run: EvalRun): Promise<void> {
    const controller = new AbortController();
    this.active.set(run.id, controller);
    const progress: EvalRunProgress = {
      completed: 0,
      total: run.items.length * run.models.length,
      model: null,
    };
    const totals: ModelTotals[] = [];
    /** Graders stopped at their deadline: not run again in this run (each would cost the deadline again). */
    const stopped = new Map<string, string>();
    let buffer: EvalResult[] = [];
    let lastFlush = Date.now();
    // Results wait out an outage of the database (the answers in flight wait with them), never lost.
    const persist = <T>(work: () => Promise<T>) => this.health.retry(work, () => this.closed);
    const flush = async () => {
      const batch = buffer;
      buffer = [];
      lastFlush = Date.now();
      try {
        await persist(() => this.evals.addResults(batch));
      } catch (error) {
        buffer.unshift(...batch);
        throw error;
      }
      if (!(await persist(() => this.evals.updateProgress(run.id, progress, totals))))
        controller.abort(new ConduitError("conflict", "cancelled"));
      this.events.emit("changed", run.id);
    };
    // The run's progress is written as answers come, and at least every HEARTBEAT_MS (others see the server alive).
    let beating = false;
    const heartbeat = setInterval(() => {
      if (beating || Date.now() - lastFlush < HEARTBEAT_MS) return;
      beating = true;
      void flush()
        .catch(() => undefined)
        .finally(() => (beating = false));
    }, HEARTBEAT_MS);
    try {
      for (const [modelIndex, model] of run.models.entries()) {
        progress.model = model;
        const ref = await persist(() => this.inference.resolve(run.userId, model, "model"));
        const systemPrompt = await persist(() => this.systemPromptFor(run, ref));
        const total = emptyTotals(model, run.config.graders);
        totals.push(total);
        let next = 0;
        const answerOne = async (itemIndex: number) => {
          const item = run.items[itemIndex] as ResolvedItem;
          const result = await this.answer(run, ref, systemPrompt, item, controller.signal, stopped);
          addTo(total, result, run.config.graders);
          buffer.push({ runId: run.id, modelIndex, itemIndex, model, ...result });
          progress.completed++;
          if (Date.now() - lastFlush > 250) await flush();
        };
        const worker = async () => {
          while (next < run.items.length && !controller.signal.aborted) await answerOne(next++);
        };
        await Promise.all(Array.from({ length: Math.min(run.config.parallel, run.items.length) }, worker));
        if (controller.signal.aborted) break;
      }
      if (controller.signal.aborted) {
        await this.evals.addResults(buffer);
        if (!this.closed) return;
        await this.evals.finish(run.id, {
          status: "FAILED",
          error: "the server shut down",
          progress,
          results: totals,
        });
        return;
      }
      await persist(() => this.evals.addResults(buffer));
      buffer = [];
      progress.model = null;
      await persist(() => this.evals.finish(run.id, { status: "COMPLETED", progress, results: totals }));
    } catch (error) {
      const message =
        error instanceof ConduitError ? error.message : "an unexpected error (see the server log)";
      if (!(error instanceof ConduitError))
        this.log.error({ err: error, evalRun: run.id }, "eval run failed");
      await persist(() => this.evals.addResults(buffer)).catch(() => undefined);
      await persist(() =>
        this.evals.finish(run.id, { status: "FAILED", error: message, progress, results: totals }),
      );
    } finally {
      clearInterval(heartbeat);
      this.active.delete(run.id);
      this.events.emit("changed", run.id);
    }
  }

  /** A fine-tune answers with its own system prompt when it was trained with one; anything else with the eval's. */
  private async systemPromptFor(run: EvalRun, ref: ModelRef): Promise<string> {
    if (ref.id.startsWith("ft_")) {
      const trained = await this.runRepository.get(run.userId, ref.id);
      if (trained?.config.systemPrompt) return trained.config.systemPrompt;
    }
    return run.config.systemPrompt;
  }

  /** One model's answer to one item, timed and scored; a failed generation is an errored result, not a failed run. */
  private async answer(
    run: EvalRun,
    ref: ModelRef,
    systemPrompt: string,
    item: ResolvedItem,
    signal: AbortSignal,
    stopped: Map<string, string>,
  ): Promise<Omit<EvalResult, "runId" | "modelIndex" | "itemIndex" | "model">> {
    const messages =
      systemPrompt && item.messages[0]?.role !== "system"
        ? [{ role: "system" as const, content: systemPrompt }, ...item.messages]
        : item.messages;
    const started = performance.now();
    try {
      const result = await this.generate(
        run.userId,
        { messages, sampling: greedy(run.config.maxTokens), signal },
        ref,
      );
      const answer = result.choices[0]?.text ?? "";
      return {
        answer,
        scores: await this.scores(run, item, answer, stopped, signal),
        latencyMs: performance.now() - started,
        promptTokens: result.promptTokens,
        completionTokens: result.completionTokens,
        error: null,
      };
    } catch (error) {
      if (signal.aborted) throw signal.reason;
      return {
        answer: "",
        scores: run.config.graders.map((grader) => ({ name: grader.name, score: 0, passed: false })),
        latencyMs: performance.now() - started,
        promptTokens: 0,
        completionTokens: 0,
        error: error instanceof ConduitError ? error.message : "generation failed (see the server log)",
      };
    }
  }

  /**
   * A generation of an eval (an answer, a judge's verdict). A queue full of other users' requests: wait as told
   * and try again (up to 30 times). The database away (a fine-tune's lookup): wait for it, the item is not the
   * model's failure. Anything else, or an abort, is thrown.
   */
  private async generate(
    ...[userId, input, model]: Parameters<InferenceService["generate"]>
  ): ReturnType<InferenceService["generate"]> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.inference.generate(userId, input, model);
      } catch (error) {
        if (input.signal?.aborted) throw error;
        if (error instanceof ConduitError && error.code === "rate_limited" && attempt < 30) {
          await new Promise((resolve) => setTimeout(resolve, 1000 * (error.retryAfter ?? 1)));
          continue;
        }
        if (this.health.saw(error) && !this.closed) {
          await new Promise((resolve) => setTimeout(resolve, 1000));
          continue;
        }
        throw error;
      }
    }
  }

  /**
   * Every grader's score of one answer: the cheap ones here, the others on the grading thread. A grader stopped at
   * its deadline scores this answer as an error, and the rest of the run's answers too without being run again.
   */
  private scores(
    run: EvalRun,
    item: ResolvedItem,
    answer: string,
    stopped: Map<string, string>,
    signal: AbortSignal,
  ): Promise<GraderScore[]> {
    const expected = item.expected;
    return Promise.all(
      run.config.graders.map(async (grader) => {
        const why = stopped.get(grader.name);
        if (why !== undefined) return { name: grader.name, score: 0, passed: false, error: why };
        if (isModelGrader(grader)) return this.judge(run.userId, grader, item, answer, signal);
        if (gradesInline(grader)) return grade(grader, answer, expected);
        const { score, timedOut } = await this.graderThread.score(grader, answer, expected);
        if (timedOut)
          stopped.set(
            grader.name,
            `not run: the ${grader.type} grader ran past its ${this.graderThread.timeoutMs / 1000} s limit on an earlier answer of this run`,
          );
        return score;
      }),
    );
  }

  /**
   * A model grader's score of one answer: its judge (any model the user can name) reads the rendered template and
   * answers in the grader's JSON shape, held to it by a grammar. A judge that fails is a grader error on this answer.
   */
  private async judge(
    userId: string,
    grader: ModelGrader,
    item: ResolvedItem,
    answer: string,
    signal: AbortSignal,
  ): Promise<GraderScore> {
    const lastUser = item.messages.findLast((m) => m.role === "user")?.content ?? "";
    const fields = { input: lastUser, expected: item.expected, messages: item.messages, ...(item.raw ?? {}) };
    const prompt = judgePrompt(grader, { item: fields, sample: { output_text: answer } });
    if ("error" in prompt) return { name: grader.name, score: 0, passed: false, error: prompt.error };
    try {
      const result = await this.generate(userId, {
        model: grader.model,
        messages: prompt.messages,
        sampling: {
          ...greedy(grader.maxTokens),
          ...(grader.temperature > 0 ? { temperature: grader.temperature, topK: 0 } : {}),
        },
        responseFormat: { kind: "json_schema", schema: judgeSchema(grader) },
        signal,
      });
      return {
        ...readVerdict(grader, result.choices[0]?.text ?? ""),
        usage: {
          model: grader.model,
          promptTokens: result.promptTokens,
          completionTokens: result.completionTokens,
        },
      };
    } catch (error) {
      if (signal.aborted) throw signal.reason;
      if (!(error instanceof ConduitError))
        this.log.error({ err: error, judge: grader.model }, "judge failed");
      return {
        name: grader.name,
        score: 0,
        passed: false,
        error: `the judge failed: ${error instanceof ConduitError ? error.message : "see the server log"}`,
      };
    }
  }

  // --- the automatic before/after of a fine-tuning run ---

  /**
   * Scores a READY run's base model and the fine-tune on its eval split, greedy, exact match and similarity, and
   * writes the outcome to the run's log. A run without an eval split is left alone.
   */
  async evaluateRun(runId: string): Promise<EvalRun | undefined> {
    const run = await this.runRepository.getById(runId);
    if (!run || run.status !== "READY") return undefined;
    let items: ResolvedItem[];
    try {
      items = (await this.heldOut(run, "runId")).slice(0, AFTER_RUN_MAX_ITEMS);
    } catch (error) {
      if (error instanceof ConduitError && error.code === "conflict") return undefined;
      throw error;
    }
    const judge = run.config.judgeModel;
    const evalOf = (graders: GraderSpec[]) =>
      this.create(run.userId, {
        name: `${run.name}: base vs fine-tune`,
        source: { type: "run", runId: run.id },
        graders,
        systemPrompt: run.config.systemPrompt,
        runId: run.id,
      });
    // A judge deleted since the run was created: the before/after goes on without it, and the log says so.
    const created =
      judge === undefined
        ? await evalOf(AFTER_RUN_GRADERS)
        : await evalOf([...AFTER_RUN_GRADERS, afterRunJudge(judge)]).catch(async (error: unknown) => {
            if (!(error instanceof ConduitError && error.code === "invalid_request")) throw error;
            await this.runRepository.appendLog(
              run.id,
              `evaluation: the judge ${judge} cannot grade it (${error.message}); scoring without a judge`,
            );
            return evalOf(AFTER_RUN_GRADERS);
          });
    // Room for the longest expected answer (a token is rarely shorter than a character), and a little more.
    const longest = Math.max(...items.map((item) => item.expected.length));
    const evalRun = await this.createRun(run.userId, created.id, {
      models: [run.config.baseModelName, run.id],
      name: "before/after",
      maxTokens: Math.min(evalLimits.maxTokens, Math.max(16, longest + 16)),
      items,
    });
    const judged = created.config.graders.some((g) => g.name === AFTER_RUN_JUDGE && isModelGrader(g));
    await this.runRepository.appendLog(
      run.id,
      `evaluation queued: base ${run.config.baseModelName} and the fine-tune on ${items.length} held-out pairs` +
        `${judged ? `, judged by ${judge}` : ""} (eval ${created.id})`,
    );
    const started = performance.now();
    const ended = await this.waitFor(run.userId, created.id, evalRun.id);
    const evaluation = describeEvaluation(ended);
    await this.runRepository.appendLog(
      run.id,
      `evaluation: ${evaluation.summary} (in ${((performance.now() - started) / 1000).toFixed(1)} s)`,
    );
    return ended;
  }

  private async waitFor(userId: string, evalId: string, id: string): Promise<EvalRun> {
    for await (const _event of await this.follow(userId, evalId, id)) {
      // Followed to the end.
    }
    return this.getRun(userId, evalId, id);
  }

  /**
   * A run's before/after, from the latest run of the latest eval made for it; null when none was. One point
   * read, which SQLite answers from memory until anything is committed: call it for a run the user owns.
   */
  async evaluationOf(userId: string, runId: string): Promise<RunEvaluation | null> {
    const latest = await this.evals.evalRunOfRun(userId, runId);
    return latest ? describeEvaluation(latest) : null;
  }

  /** {@link evaluationOf} of each of the user's `runIds`, in one query: by run id, null for those without one. */
  async evaluationsOf(userId: string, runIds: readonly string[]): Promise<Map<string, RunEvaluation | null>> {
    const found = await this.evals.evalRunsOfRuns(userId, runIds);
    return new Map(
      runIds.map((id) => {
        const latest = found.get(id);
        return [id, latest ? describeEvaluation(latest) : null];
      }),
    );
  }
}

function emptyTotals(model: string, graders: EvalGrader[]): ModelTotals {
  return {
    model,
    answered: 0,
    errored: 0,
    passed: 0,
    graders: graders.map((g) => ({ name: g.name, type: g.type, passed: 0, failed: 0, meanScore: 0 })),
    promptTokens: 0,
    completionTokens: 0,
    meanLatencySeconds: 0,
  };
}

function addTo(
  total: ModelTotals,
  result: Omit<EvalResult, "runId" | "modelIndex" | "itemIndex" | "model">,
  graders: EvalGrader[],
): void {
  const n = total.answered + total.errored;
  total.meanLatencySeconds = (total.meanLatencySeconds * n + result.latencyMs / 1000) / (n + 1);
  total.promptTokens += result.promptTokens;
  total.completionTokens += result.completionTokens;
  if (result.error !== null) total.errored++;
  else total.answered++;
  if (result.error === null && result.scores.every((s) => s.passed)) total.passed++;
  for (const score of result.scores) if (score.usage) addJudgeUsage(total, score.usage);
  for (const [g, grader] of graders.entries()) {
    const score = result.scores[g];
    const sum = total.graders[g];
    if (!score || !sum || grader.name !== score.name) continue;
    sum.meanScore = (sum.meanScore * n + score.score) / (n + 1);
    if (score.passed) sum.passed++;
    else sum.failed++;
  }
}

/** Counts one verdict's tokens in its judge's usage of `total`. */
function addJudgeUsage(total: ModelTotals, usage: JudgeUsage): void {
  const usages = (total.judgeUsage ??= []);
  let entry = usages.find((u) => u.model === usage.model);
  if (!entry)
    usages.push((entry = { model: usage.model, promptTokens: 0, completionTokens: 0, invocations: 0 }));
  entry.promptTokens += usage.promptTokens;
  entry.completionTokens += usage.completionTokens;
  entry.invocations = (entry.invocations ?? 0) + 1;
}

/** An item given in a request: its prompt turns (or input) and expected answer. */
function itemOf(item: EvalItem, param: string): ResolvedItem {
  if (item.messages && item.input !== undefined)
    throw new ConduitError("invalid_request", `"${param}" has both "input" and "messages"; send one`, {
      param,
    });
  if (item.messages) return { messages: item.messages, expected: item.expected };
  if (item.input === undefined)
    throw new ConduitError("invalid_request", `"${param}" needs "input" or "messages"`, {
      param: `${param}.input`,
    });
  return { messages: [{ role: "user", content: item.input }], expected: item.expected };
}

/** A dataset pair as an item: the conversation up to its last assistant turn, and that turn as the answer expected. */
function pairItem(pair: IoPair): ResolvedItem {
  if (!pair.messages) return { messages: [{ role: "user", content: pair.input }], expected: pair.output };
  const turns = pair.messages.map(({ role, content }) => ({ role, content }));
  let last = turns.length - 1;
  while (last >= 0 && turns[last]?.role !== "assistant") last--;
  return {
    messages: turns.slice(0, Math.max(0, last)).filter((t) => t.role !== "tool") as ResolvedItem["messages"],
    expected: turns[last]?.content ?? pair.output,
  };
}

async function collect(
  pairs: AsyncIterable<IoPair>,
  map: (pair: IoPair) => ResolvedItem,
  param: string,
): Promise<ResolvedItem[]> {
  const items: ResolvedItem[] = [];
  for await (const pair of pairs) {
    items.push(map(pair));
    if (items.length > evalLimits.maxItems)
      throw new ConduitError("invalid_request", `"${param}" has more than ${evalLimits.maxItems} items`, {
        param,
      });
  }
  return items;
}
