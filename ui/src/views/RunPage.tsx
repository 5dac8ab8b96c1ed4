import { useEffect, useRef, useState } from "preact/hooks";
import { mergeStats } from "../../../src/client/runEvents.ts";
import { currentEstimate, describeEstimate } from "../../../src/contract/estimate.ts";
import {
  api,
  ApiError,
  isLive,
  type Run,
  type RunCheckpoint,
  type RunEvaluation,
  type RunExample,
  type RunStats,
  type RunStatus,
} from "../api.ts";
import { ErrorNote, Loading, StatusBadge } from "../components/common.tsx";
import { LossChart } from "../components/LossChart.tsx";
import { Table, type Column } from "../components/Table.tsx";
import { configRows, formatDuration, formatNumber, formatShare, formatTime } from "../format.ts";
import { messageOf, useAction, useResource } from "../hooks.ts";
import { Link, navigate } from "../router.tsx";

/** Lines of log kept on the page; the run itself keeps them all. */
const logTail = 300;

interface Live {
  status: RunStatus | "DELETED";
  error: string | null;
  stats: RunStats;
  /** When `stats` were written (ms since the epoch): a RUNNING run's `etaSeconds` counts from then. */
  statsAt: number;
  logs: string[];
}

/**
 * Follows a run over its events stream. The client resumes a dropped connection itself; a stream that
 * could not be opened at all is tried again every 2 s while the run is live. Each stream starts with the
 * whole log: the lines shown stay until it has caught up with them.
 */
function useRunEvents(
  id: string,
  initial: Run | undefined,
): { live: Live | undefined; streamError?: string } {
  const [live, setLive] = useState<Live>();
  const [streamError, setStreamError] = useState<string>();
  const started = initial !== undefined;
  useEffect(() => {
    if (!initial) return;
    const controller = new AbortController();
    let status: RunStatus | "DELETED" = initial.status;
    setLive({
      status,
      error: initial.error,
      stats: initial.stats,
      statsAt: Date.parse(`${initial.updatedAt.replace(" ", "T")}Z`),
      logs: initial.logs.slice(-logTail),
    });
    let shown = initial.logs.length;
    const paused = (error: unknown) => setStreamError(`Live updates paused: ${messageOf(error)} Retrying…`);
    const follow = async () => {
      while (!controller.signal.aborted) {
        let logs: string[] = [];
        let received = 0;
        try {
          const events = api.runEvents(id, { signal: controller.signal, retries: Infinity, onRetry: paused });
          for await (const event of events) {
            setStreamError(undefined);
            if (event.event === "log") {
              logs = [...logs, event.data.line].slice(-logTail);
              received++;
              if (received >= shown) {
                shown = received;
                const snapshot = logs;
                setLive((l) => l && { ...l, logs: snapshot });
              }
            } else if (event.event === "stats") {
              const stats = event.data;
              setLive((l) => l && { ...l, stats: mergeStats(l.stats, stats), statsAt: Date.now() });
            } else {
              status = event.data.status;
              const { error } = event.data;
              setLive((l) => l && { ...l, status, error });
            }
          }
          return;
        } catch (error) {
          if (controller.signal.aborted) return;
          paused(error);
        }
        if (!isLive(status)) return;
        await new Promise((resolve) => setTimeout(resolve, 2000));
      }
    };
    void follow();
    return () => controller.abort();
    // Follows once the run is known; `initial` only seeds the page.
  }, [id, started]);
  return { live, streamError };
}

/**
 * The run's automatic before/after ("base 0/20 → fine-tune 20/20 exact match …"), read again every 2 s until its
 * eval run has ended (it starts when the run becomes READY, so a page opened during training waits for it).
 */
function EvaluationLine({ id, initial }: { id: string; initial: RunEvaluation | null }) {
  const [evaluation, setEvaluation] = useState(initial);
  const [polls, setPolls] = useState(0);
  const done = evaluation !== null && !["QUEUED", "RUNNING"].includes(evaluation.status);
  useEffect(() => {
    // A run without an eval split never gets one: stop asking after a minute.
    if (done || polls > 30) return;
    const timer = setTimeout(() => {
      api.getRun(id).then(
        (r) => setEvaluation(r.evaluation ?? null),
        () => undefined,
      );
      setPolls((p) => p + 1);
    }, 2000);
    return () => clearTimeout(timer);
  }, [id, done, polls]);
  if (!evaluation) return null;
  const verdict =
    evaluation.improved === true ? "improved" : evaluation.improved === false ? "worse" : "pending";
  return (
    <p class={`note evaluation evaluation-${verdict}`} role="status">
      <strong>Before/after: </strong>
      {evaluation.summary}{" "}
      <Link
        href={`/ui/evals/${encodeURIComponent(evaluation.evalId)}?run=${encodeURIComponent(evaluation.evalRunId)}`}
      >
        See every answer
      </Link>
    </p>
  );
}

export function RunPage({ id }: { id: string }) {
  const [run, setRun] = useState<Run>();
  const [loadError, setLoadError] = useState<string>();
  useEffect(() => {
    setRun(undefined);
    setLoadError(undefined);
    api.getRun(id).then(setRun, (error: unknown) => setLoadError(messageOf(error)));
  }, [id]);
  const { live, streamError } = useRunEvents(id, run);
  const action = useAction();

  const back = (
    <p>
      <Link href="/ui/runs">← Runs</Link>
    </p>
  );
  if (!run || !live)
    return (
      <div class="page">
        {back}
        {loadError ? <ErrorNote message={loadError} /> : <Loading what="the run" />}
      </div>
    );

  const cancel = async () => {
    if (!confirm(`Cancel run "${run.name}"?`)) return;
    await action.run(() => api.cancelRun(run.id));
  };
  const pause = () => action.run(() => api.pauseRun(run.id));
  const resume = () => action.run(() => api.resumeRun(run.id));
  const remove = async () => {
    if (!confirm(`Delete run "${run.name}" and its model?`)) return;
    if (await action.run(() => api.deleteRun(run.id))) navigate("/ui/runs");
  };
  const stopping = live.status === "PAUSED" && trainerStopping(live.logs);
  const stats = live.stats;
  const progress = stats.step !== undefined && stats.totalSteps ? stats.step / stats.totalSteps : undefined;
  const of = (value: number | undefined, total: number | undefined) =>
    value === undefined ? "—" : `${value}${total ? ` / ${total}` : ""}`;
  // The plan made at creation, then the trainer's pace as stats arrive, then the actual time.
  const estimate =
    live.status === "DELETED"
      ? null
      : currentEstimate(run.estimate?.planned ?? null, {
          status: live.status,
          stats,
          updatedAt: live.statsAt,
        });

  return (
    <div class="page">
      {back}
      <h1>
        {run.name} <StatusBadge status={live.status} />
      </h1>
      <p class="muted">
        {`Dataset ${run.datasetName} · ${run.ioPairsCount} IO pairs · created ${formatTime(run.createdAt)} · `}
        <code>{run.id}</code>
      </p>
      <div class="toolbar">
        {live.status === "READY" ? (
          <Link href={`/ui/playground?model=${encodeURIComponent(run.id)}`} class="button primary">
            Chat with this model
          </Link>
        ) : null}
        {live.status === "QUEUED" || live.status === "RUNNING" ? (
          <button type="button" onClick={pause} disabled={action.busy}>
            Pause
          </button>
        ) : null}
        {live.status === "PAUSED" ? (
          <button
            type="button"
            onClick={resume}
            disabled={action.busy || stopping}
            title={stopping ? "Its trainer is stopping; the run resumes once it has" : undefined}
          >
            Resume
          </button>
        ) : null}
        {isLive(live.status) ? (
          <button type="button" onClick={cancel} disabled={action.busy}>
            Cancel run
          </button>
        ) : null}
        {live.status !== "DELETED" ? (
          <button type="button" class="danger" onClick={remove} disabled={action.busy}>
            Delete run
          </button>
        ) : null}
      </div>
      <ErrorNote message={action.error} />
      {live.error ? (
        <p class="note error" role="alert">
          <strong>Failed: </strong>
          {live.error}
        </p>
      ) : null}
      {streamError ? (
        <p class="note" role="status">
          {streamError}
        </p>
      ) : null}
      {live.status === "DELETED" ? (
        <p class="note" role="status">
          This run was deleted.
        </p>
      ) : null}
      {live.status === "READY" ? <EvaluationLine id={run.id} initial={run.evaluation ?? null} /> : null}
      <h2>Progress</h2>
      {estimate ? <p class="muted">Estimate: {describeEstimate(estimate)}</p> : null}
      {progress !== undefined ? (
        <progress max={1} value={progress} aria-label="Training progress" class="wide-progress" />
      ) : null}
      <dl class="stats" aria-live="off">
        <Stat label="Step" value={of(stats.step, stats.totalSteps)} />
        <Stat label="Epoch" value={of(stats.epoch, stats.epochs)} />
        <Stat label="Train loss" value={formatNumber(stats.trainLoss)} />
        <Stat label="Eval loss" value={formatNumber(stats.evalLoss)} />
        {stats.rewardMargin !== undefined ? (
          <>
            <Stat label="Reward margin" value={formatNumber(stats.rewardMargin)} />
            <Stat label="Preferred wins" value={formatShare(stats.rewardAccuracy)} />
          </>
        ) : null}
        {stats.evalRewardMargin !== undefined ? (
          <>
            <Stat label="Eval reward margin" value={formatNumber(stats.evalRewardMargin)} />
            <Stat label="Eval preferred wins" value={formatShare(stats.evalRewardAccuracy)} />
          </>
        ) : null}
        <Stat label="Tokens / s" value={formatNumber(stats.tokensPerSecond, 3)} />
        <Stat label="Elapsed" value={formatDuration(stats.elapsedSeconds)} />
        <Stat
          label="ETA"
          value={estimate && estimate.basis !== "final" ? formatDuration(estimate.remainingSeconds) : "—"}
        />
        <Stat
          label="Best epoch"
          value={typeof stats.bestEpoch === "number" ? String(stats.bestEpoch) : "—"}
        />
      </dl>
      {stats.warnings && stats.warnings.length > 0 ? (
        <div class="note" role="status">
          <strong>Warnings</strong>
          <ul>
            {stats.warnings.map((warning, i) => (
              <li key={i}>{warning}</li>
            ))}
          </ul>
        </div>
      ) : null}
      <h2>Loss</h2>
      <LossChart stats={stats} />
      {live.status === "READY" && run.config.method === "lora" ? <Checkpoints runId={run.id} /> : null}
      {live.status === "READY" ? <WorstExamples runId={run.id} /> : null}
      <h2>Log</h2>
      <LogTail lines={live.logs} />
      <h2>Configuration</h2>
      <dl class="config">
        {configRows(run.config).map(([label, value]) => (
          <Stat key={label} label={label} value={value} />
        ))}
      </dl>
    </div>
  );
}

/**
 * Whether a paused run's trainer is still stopping (OpenAI's `pausing`): the pause of a running run is logged, and
 * the line its worker writes once the trainer has stopped (`run paused: …`) has not come yet.
 */
function trainerStopping(logs: string[]): boolean {
  const asked = logs.findLastIndex((line) => line.includes("run paused by the user (was RUNNING)"));
  return asked >= 0 && !logs.slice(asked).some((line) => line.includes("run paused: "));
}

function Stat({ label, value }: { label: string; value: string }) {
  return (
    <div>
      <dt>{label}</dt>
      <dd>{value}</dd>
    </div>
  );
}

/** Saves a kept checkpoint's adapter through the browser's download, under the name the server gives it. */
async function downloadCheckpoint(runId: string, step: number): Promise<void> {
  const artifact = await api.downloadCheckpoint(runId, step);
  const url = URL.createObjectURL(await new Response(artifact.body).blob());
  try {
    const link = document.createElement("a");
    link.href = url;
    link.download = artifact.fileName ?? `${runId}-step-${step}-lora.gguf`;
    link.click();
  } finally {
    // The click has handed the blob to the download; the URL is no longer needed.
    setTimeout(() => URL.revokeObjectURL(url), 0);
  }
}

/**
 * A READY LoRA run's kept checkpoints (its last epochs' ends), newest first: each one's losses, the model name that
 * serves it (a link to chat with it) and its adapter to download.
 */
function Checkpoints({ runId }: { runId: string }) {
  const checkpoints = useResource(() => api.listCheckpoints(runId), [runId]);
  const action = useAction();
  const columns: Column<RunCheckpoint>[] = [
    { label: "Step", num: true, cell: (c) => c.step },
    { label: "Epoch", num: true, cell: (c) => c.epoch },
    { label: "Train loss", num: true, cell: (c) => formatNumber(c.trainLoss) },
    { label: "Eval loss", num: true, cell: (c) => formatNumber(c.evalLoss ?? undefined) },
    {
      label: "Model",
      cell: (c) => (
        <Link href={`/ui/playground?model=${encodeURIComponent(c.model)}`}>
          <code>{c.model}</code>
        </Link>
      ),
    },
    {
      label: "Download",
      actions: true,
      cell: (c) => (
        <button
          type="button"
          disabled={action.busy}
          aria-label={`Download the adapter of step ${c.step}`}
          onClick={() => void action.run(() => downloadCheckpoint(runId, c.step))}
        >
          Download
        </button>
      ),
    },
  ];
  return (
    <section aria-labelledby="checkpoints">
      <h2 id="checkpoints">Checkpoints</h2>
      <ErrorNote message={checkpoints.error ?? action.error} />
      <Table
        label="Kept checkpoints"
        columns={columns}
        rows={checkpoints.data}
        rowKey={(c) => c.step}
        loading={checkpoints.error ? undefined : "the checkpoints"}
        empty="This run kept no checkpoints."
      />
    </section>
  );
}

/** How many of a READY run's examples the page shows, the worst learned first. */
const worstCount = 10;

const exampleColumns: Column<RunExample>[] = [
  { label: "Loss", num: true, cell: (e) => (e.loss === null ? "—" : formatNumber(e.loss)) },
  { label: "Split", cell: (e) => e.split },
  { label: "#", num: true, cell: (e) => e.index },
  { label: "Input", cell: (e) => e.input },
  { label: "Output", cell: (e) => e.output },
];

/**
 * The examples a READY run learned worst (highest loss under the served weights). A run without
 * them (trained before Conduit measured them) is a 409, said as a plain note rather than an error.
 */
function WorstExamples({ runId }: { runId: string }) {
  const [state, setState] = useState<{ examples?: RunExample[]; missing?: string; error?: string }>({});
  useEffect(() => {
    let current = true;
    setState({});
    api.listExamples(runId, { sort: "loss", limit: worstCount }).then(
      ({ items }) => current && setState({ examples: items }),
      (error: unknown) =>
        current &&
        setState(
          error instanceof ApiError && error.status === 409
            ? { missing: error.message }
            : { error: messageOf(error) },
        ),
    );
    return () => {
      current = false;
    };
  }, [runId]);
  return (
    <section aria-labelledby="worst-examples">
      <h2 id="worst-examples">Worst examples</h2>
      <ErrorNote message={state.error} />
      {state.missing ? (
        <p class="muted">{state.missing}</p>
      ) : (
        <Table
          label="Worst examples"
          class="pairs"
          columns={exampleColumns}
          rows={state.examples}
          rowKey={(e) => `${e.split}-${e.index}`}
          loading={state.error ? undefined : "the examples"}
          empty="This run has no examples to show."
        />
      )}
    </section>
  );
}

/** The log's last lines, kept scrolled to the bottom unless the reader scrolled up. */
function LogTail({ lines }: { lines: string[] }) {
  const element = useRef<HTMLPreElement>(null);
  const pinned = useRef(true);
  useEffect(() => {
    const pre = element.current;
    if (pre && pinned.current) pre.scrollTop = pre.scrollHeight;
  }, [lines]);
  return (
    <pre
      ref={element}
      class="log"
      tabIndex={0}
      aria-label="Run log"
      onScroll={(event) => {
        const pre = event.currentTarget;
        pinned.current = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
      }}
    >
      {lines.length > 0 ? lines.join("\n") : "No log lines yet."}
    </pre>
  );
}
