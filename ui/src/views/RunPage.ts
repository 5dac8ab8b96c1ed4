import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { api, ApiError, type Run, type RunExample, type RunStats, type RunStatus } from "../api.ts";
import { ErrorNote, Loading, StatusBadge, TableScroll } from "../components/common.ts";
import { LossChart } from "../components/LossChart.ts";
import { formatDuration, formatNumber, formatTime } from "../format.ts";
import { messageOf, useAction } from "../hooks.ts";
import { Link, navigate } from "../router.ts";
import { mergeStats } from "../runStats.ts";

/** Lines of log kept on the page; the run itself keeps them all. */
const logTail = 300;

interface Live {
  status: RunStatus | "DELETED";
  error: string | null;
  stats: RunStats;
  logs: string[];
}

/**
 * Follows a run over its events stream (fetch with the key header; the stream replays the log
 * from the start, then sends news), reconnecting if the connection drops while the run is live.
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
      stats: initial.stats as RunStats,
      logs: initial.logs.slice(-logTail),
    });
    // Each connection replays the whole log: keep what is shown until the replay catches up.
    let shown = initial.logs.length;
    const follow = async () => {
      while (!controller.signal.aborted) {
        let logs: string[] = [];
        let received = 0;
        let statsSeen = false;
        try {
          for await (const event of api.runEvents(id, controller.signal)) {
            setStreamError(undefined);
            const data = JSON.parse(event.data) as Record<string, unknown>;
            if (event.event === "log") {
              logs = [...logs, String(data.line)].slice(-logTail);
              received++;
              if (received >= shown) {
                shown = received;
                const snapshot = logs;
                setLive((l) => l && { ...l, logs: snapshot });
              }
            } else if (event.event === "stats") {
              // Each event carries only the new loss points; a connection's first one carries them all.
              const first = !statsSeen;
              statsSeen = true;
              setLive((l) => l && { ...l, stats: mergeStats(l.stats, data as RunStats, first) });
            } else if (event.event === "status") {
              status = data.status as RunStatus | "DELETED";
              const error = (data.error as string | null) ?? null;
              setLive((l) => l && { ...l, status, error });
            }
          }
        } catch (error) {
          if (controller.signal.aborted) return;
          setStreamError(`Live updates paused: ${messageOf(error)} Retrying…`);
        }
        if (status !== "QUEUED" && status !== "RUNNING") return;
        await new Promise((resolve) => setTimeout(resolve, 2000));
      }
    };
    void follow();
    return () => controller.abort();
    // Follows once the run is known; `initial` only seeds the page.
  }, [id, started]);
  return { live, streamError };
}

export function RunPage({ id }: { id: string }) {
  const [run, setRun] = useState<Run>();
  const [loadError, setLoadError] = useState<string>();
  useEffect(() => {
    setRun(undefined);
    setLoadError(undefined);
    api.run(id).then(setRun, (error: unknown) => setLoadError(messageOf(error)));
  }, [id]);
  const { live, streamError } = useRunEvents(id, run);
  const action = useAction();

  if (!run || !live)
    return h(
      "div",
      { class: "page" },
      h("p", null, h(Link, { href: "/ui/runs" }, "← Runs")),
      loadError ? h(ErrorNote, { message: loadError }) : h(Loading, { what: "the run" }),
    );

  const cancel = async () => {
    if (!confirm(`Cancel run "${run.name}"?`)) return;
    await action.run(() => api.cancelRun(run.id));
  };
  const remove = async () => {
    if (!confirm(`Delete run "${run.name}" and its model?`)) return;
    if (await action.run(() => api.deleteRun(run.id))) navigate("/ui/runs");
  };
  const stats = live.stats;
  const progress = stats.step !== undefined && stats.totalSteps ? stats.step / stats.totalSteps : undefined;

  return h(
    "div",
    { class: "page" },
    h("p", null, h(Link, { href: "/ui/runs" }, "← Runs")),
    h("h1", null, run.name, " ", h(StatusBadge, { status: live.status })),
    h(
      "p",
      { class: "muted" },
      `Dataset ${run.datasetName} · ${run.ioPairsCount} IO pairs · created ${formatTime(run.createdAt)} · `,
      h("code", null, run.id),
    ),
    h(
      "div",
      { class: "toolbar" },
      live.status === "READY"
        ? h(
            Link,
            { href: `/ui/playground?model=${encodeURIComponent(run.id)}`, class: "button primary" },
            "Chat with this model",
          )
        : null,
      live.status === "QUEUED" || live.status === "RUNNING"
        ? h("button", { type: "button", onClick: cancel, disabled: action.busy }, "Cancel run")
        : null,
      live.status !== "DELETED"
        ? h(
            "button",
            { type: "button", class: "danger", onClick: remove, disabled: action.busy },
            "Delete run",
          )
        : null,
    ),
    h(ErrorNote, { message: action.error }),
    live.error
      ? h("p", { class: "note error", role: "alert" }, h("strong", null, "Failed: "), live.error)
      : null,
    streamError ? h("p", { class: "note", role: "status" }, streamError) : null,
    live.status === "DELETED" ? h("p", { class: "note", role: "status" }, "This run was deleted.") : null,
    h("h2", null, "Progress"),
    progress !== undefined
      ? h("progress", { max: 1, value: progress, "aria-label": "Training progress", class: "wide-progress" })
      : null,
    h(
      "dl",
      { class: "stats", "aria-live": "off" },
      stat(
        "Step",
        stats.step !== undefined ? `${stats.step}${stats.totalSteps ? ` / ${stats.totalSteps}` : ""}` : "—",
      ),
      stat(
        "Epoch",
        stats.epoch !== undefined ? `${stats.epoch}${stats.epochs ? ` / ${stats.epochs}` : ""}` : "—",
      ),
      stat("Train loss", formatNumber(stats.trainLoss)),
      stat("Eval loss", formatNumber(stats.evalLoss)),
      stat("Tokens / s", formatNumber(stats.tokensPerSecond, 3)),
      stat("Elapsed", formatDuration(stats.elapsedSeconds)),
      stat("ETA", live.status === "RUNNING" ? formatDuration(stats.etaSeconds) : "—"),
      stat("Best epoch", typeof stats.bestEpoch === "number" ? String(stats.bestEpoch) : "—"),
    ),
    stats.warnings && stats.warnings.length > 0
      ? h(
          "div",
          { class: "note", role: "status" },
          h("strong", null, "Warnings"),
          h(
            "ul",
            null,
            stats.warnings.map((warning, i) => h("li", { key: i }, warning)),
          ),
        )
      : null,
    h("h2", null, "Loss"),
    h(LossChart, { stats }),
    live.status === "READY" ? h(WorstExamples, { runId: run.id }) : null,
    h("h2", null, "Log"),
    h(LogTail, { lines: live.logs }),
    h("h2", null, "Configuration"),
    h(
      "dl",
      { class: "config" },
      Object.entries(run.config).map(([key, value]) => stat(key, configValue(value))),
    ),
  );
}

/** A config value in words: lists joined by commas, nothing as a dash. */
function configValue(value: unknown): string {
  const text = Array.isArray(value)
    ? value.join(", ")
    : value === null || value === undefined
      ? ""
      : String(value);
  return text === "" ? "—" : text;
}

/** How many of a READY run's examples the page shows, the worst learned first. */
const worstCount = 10;

/**
 * The examples a READY run learned worst (highest loss under the served weights). A run without
 * them (trained before Conduit measured them) is a 409, said as a plain note rather than an error.
 */
function WorstExamples({ runId }: { runId: string }) {
  const [state, setState] = useState<{ examples?: RunExample[]; missing?: string; error?: string }>({});
  useEffect(() => {
    let current = true;
    setState({});
    api.worstExamples(runId, worstCount).then(
      (examples) => current && setState({ examples }),
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
  return h(
    "section",
    { "aria-labelledby": "worst-examples" },
    h("h2", { id: "worst-examples" }, "Worst examples"),
    h(ErrorNote, { message: state.error }),
    state.missing
      ? h("p", { class: "muted" }, state.missing)
      : state.examples === undefined
        ? state.error
          ? null
          : h(Loading, { what: "the examples" })
        : state.examples.length === 0
          ? h("p", { class: "muted" }, "This run has no examples to show.")
          : h(ExampleTable, { examples: state.examples }),
  );
}

function ExampleTable({ examples }: { examples: RunExample[] }) {
  return h(
    TableScroll,
    { label: "Worst examples" },
    h(
      "table",
      { class: "pairs stack" },
      h(
        "thead",
        null,
        h(
          "tr",
          null,
          h("th", { scope: "col", class: "num" }, "Loss"),
          h("th", { scope: "col" }, "Split"),
          h("th", { scope: "col", class: "num" }, "#"),
          h("th", { scope: "col" }, "Input"),
          h("th", { scope: "col" }, "Output"),
        ),
      ),
      h(
        "tbody",
        null,
        examples.map((e) =>
          h(
            "tr",
            { key: `${e.split}-${e.index}` },
            h("td", { class: "num", "data-label": "Loss" }, e.loss === null ? "—" : formatNumber(e.loss)),
            h("td", { "data-label": "Split" }, e.split),
            h("td", { class: "num", "data-label": "#" }, e.index),
            h("td", { "data-label": "Input" }, e.input),
            h("td", { "data-label": "Output" }, e.output),
          ),
        ),
      ),
    ),
  );
}

function stat(label: string, value: string) {
  return h("div", { key: label }, h("dt", null, label), h("dd", null, value));
}

/** The log's last lines, kept scrolled to the bottom unless the reader scrolled up. */
function LogTail({ lines }: { lines: string[] }) {
  const element = useRef<HTMLPreElement>(null);
  const pinned = useRef(true);
  useEffect(() => {
    const pre = element.current;
    if (pre && pinned.current) pre.scrollTop = pre.scrollHeight;
  }, [lines]);
  return h(
    "pre",
    {
      ref: element,
      class: "log",
      tabIndex: 0,
      "aria-label": "Run log",
      onScroll: (event: Event) => {
        const pre = event.currentTarget as HTMLPreElement;
        pinned.current = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
      },
    },
    lines.length > 0 ? lines.join("\n") : "No log lines yet.",
  );
}
