import { useState } from "preact/hooks";
import { api, type EvalResult, type EvalRun } from "../api.ts";
import { ErrorNote, Field, Loading } from "../components/common.tsx";
import { Table } from "../components/Table.tsx";
import { formatScores, formatTime, judgeNotes } from "../format.ts";
import { useInterval, useResource } from "../hooks.ts";
import { Link } from "../router.tsx";

const live = (run: EvalRun | undefined) =>
  run !== undefined && (run.status === "QUEUED" || run.status === "RUNNING");

/** One item with every model's answer: the diff view's row. */
interface ItemRow {
  item: number;
  input: string;
  expected: string;
  answers: (EvalResult | undefined)[];
}

function rowsOf(run: EvalRun, results: EvalResult[]): ItemRow[] {
  const byItem = new Map<number, ItemRow>();
  for (const result of results) {
    let row = byItem.get(result.item);
    if (!row) {
      row = {
        item: result.item,
        input: result.input,
        expected: result.expected,
        answers: run.models.map(() => undefined),
      };
      byItem.set(result.item, row);
    }
    row.answers[run.models.indexOf(result.model)] = result;
  }
  return [...byItem.values()].sort((a, b) => a.item - b.item);
}

/** The choice of the run selector that shows every run of an eval side by side. */
const ALL_RUNS = "all";

/**
 * Whether an eval's runs are best read side by side: several runs of one model each, as OpenAI's Evals API makes
 * them (one `data_source` model per run), where Conduit's own runs score every model of the eval in one.
 */
function oneModelPerRun(runs: EvalRun[]): boolean {
  return runs.length > 1 && runs.every((r) => r.models.length === 1);
}

/**
 * Several runs as one, each run's model a column: labelled by the model's name, with the run's name after it
 * when two runs scored the same model, in the order the runs were made (a base's run, then its fine-tune's, say). Its
 * status is a live run's, else the first that did not complete.
 */
export function sideBySide(newestFirst: EvalRun[]): { run: EvalRun; labelOf: (runId: string) => string[] } {
  const runs = [...newestFirst].sort(
    (a, b) => a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id),
  );
  const count = new Map<string, number>();
  for (const r of runs) for (const model of r.models) count.set(model, (count.get(model) ?? 0) + 1);
  const labels = new Map(
    runs.map((r) => [r.id, r.models.map((m) => ((count.get(m) ?? 0) > 1 ? `${m} (${r.name})` : m))]),
  );
  const labelOf = (runId: string) => labels.get(runId) ?? [];
  const first = runs[0]!;
  const errors = runs.filter((r) => r.error).map((r) => `${r.name}: ${r.error}`);
  return {
    labelOf,
    run: {
      ...first,
      id: ALL_RUNS,
      name: `${runs.length} runs side by side`,
      models: runs.flatMap((r) => labelOf(r.id)),
      status: (runs.find(live) ?? runs.find((r) => r.status !== "COMPLETED") ?? first).status,
      progress: {
        model: runs.find(live)?.progress.model ?? null,
        completed: runs.reduce((sum, r) => sum + r.progress.completed, 0),
        total: runs.reduce((sum, r) => sum + r.progress.total, 0),
      },
      results: runs.flatMap((r) =>
        r.results.map((totals) => ({
          ...totals,
          model: labelOf(r.id)[r.models.indexOf(totals.model)] ?? totals.model,
        })),
      ),
      error: errors.length > 0 ? errors.join("; ") : null,
    },
  };
}

/** Every answer of `runs` (one run, or all side by side), each with its model's column label. */
async function resultsOf(evalId: string, runs: EvalRun[], labelOf: (runId: string) => string[]) {
  const lists = await Promise.all(
    runs.map(async (r) =>
      (await api.evalResults(evalId, r.id, { limit: 10_000 })).map((result) => ({
        ...result,
        model: labelOf(r.id)[r.models.indexOf(result.model)] ?? result.model,
      })),
    ),
  );
  return lists.flat();
}

/**
 * An eval: its runs, a table per model (each grader's totals), and every item with each model's answer. An eval
 * whose runs scored one model each (OpenAI's shape) shows them all side by side unless one is chosen.
 */
export function EvalPage({ id, runId }: { id: string; runId: string | null }) {
  const evaluation = useResource(() => api.getEval(id), [id]);
  const runs = useResource(() => api.listEvalRuns(id), [id]);
  const [chosen, setChosen] = useState(runId);
  const combinable = runs.data !== undefined && oneModelPerRun(runs.data);
  const combined =
    combinable && (chosen === null || chosen === ALL_RUNS) ? sideBySide(runs.data!) : undefined;
  const run = combined?.run ?? runs.data?.find((r) => r.id === chosen) ?? runs.data?.[0];
  const shownRuns = combined ? runs.data! : run ? [run] : [];
  const results = useResource(
    () =>
      resultsOf(
        id,
        shownRuns,
        combined?.labelOf ?? ((runId) => shownRuns.find((r) => r.id === runId)?.models ?? []),
      ),
    [id, run?.id, run?.progress.completed],
  );
  const [onlyDifferent, setOnlyDifferent] = useState(false);
  useInterval(() => runs.reload(), 1500, live(run));

  const back = (
    <p>
      <Link href="/ui/evals">← Evals</Link>
    </p>
  );
  if (!evaluation.data)
    return (
      <div class="page">
        {back}
        {evaluation.error ? <ErrorNote message={evaluation.error} /> : <Loading what="the eval" />}
      </div>
    );
  const e = evaluation.data;
  const items = run && results.data ? rowsOf(run, results.data) : undefined;
  const shown = onlyDifferent
    ? items?.filter((row) => new Set(row.answers.map((a) => a?.scores[0]?.passed)).size > 1)
    : items;
  return (
    <div class="page">
      {back}
      <h1>{e.name}</h1>
      <p class="muted">
        {`Graders: ${e.graders.map((g) => String(g.name)).join(", ")} · created ${formatTime(e.createdAt)} · `}
        <code>{e.id}</code>
        {e.runId ? (
          <>
            {" · before/after of run "}
            <Link href={`/ui/runs/${encodeURIComponent(e.runId)}`}>{e.runId}</Link>
          </>
        ) : null}
      </p>
      <ErrorNote message={runs.error ?? results.error} />
      {runs.data && runs.data.length > 1 ? (
        <label>
          {"Eval run "}
          <select value={run?.id} onChange={(event) => setChosen(event.currentTarget.value)}>
            {combinable ? <option value={ALL_RUNS}>All runs side by side</option> : null}
            {runs.data.map((r) => (
              <option key={r.id} value={r.id}>{`${r.name} (${r.status}, ${formatTime(r.createdAt)})`}</option>
            ))}
          </select>
        </label>
      ) : null}
      {run === undefined ? (
        runs.data ? (
          <p class="muted">No runs of this eval yet.</p>
        ) : (
          <Loading what="its runs" />
        )
      ) : (
        <>
          <h2>
            {run.name} <span class={`badge badge-${run.status.toLowerCase()}`}>{run.status}</span>
          </h2>
          {live(run) ? (
            <progress
              max={run.progress.total}
              value={run.progress.completed}
              aria-label="Eval progress"
              class="wide-progress"
            />
          ) : null}
          <p class="muted">{`${run.progress.completed} / ${run.progress.total} answers${run.error ? ` · ${run.error}` : ""}`}</p>
          {run.results.map((totals) => (
            <section key={totals.model} class="card" aria-label={`Scores of ${totals.model}`}>
              <h3>{totals.model}</h3>
              <Table
                label={`Scores of ${totals.model}`}
                rows={totals.graders}
                rowKey={(g) => g.name}
                columns={[
                  { label: "Grader", cell: (g) => g.name },
                  {
                    label: "Passed",
                    num: true,
                    cell: (g) => `${g.passed} / ${totals.answered + totals.errored}`,
                  },
                  { label: "Mean score", num: true, cell: (g) => g.meanScore.toFixed(3) },
                ]}
              />
              <p class="muted">
                {`${totals.completionTokens} tokens out · ${totals.meanLatencySeconds.toFixed(2)} s per answer` +
                  (totals.errored ? ` · ${totals.errored} errors` : "")}
              </p>
            </section>
          ))}
          <h2>Items</h2>
          <Field label="Only items the models disagree on (first grader)" check>
            <input
              type="checkbox"
              checked={onlyDifferent}
              onChange={(event) => setOnlyDifferent(event.currentTarget.checked)}
            />
          </Field>
          <Table
            label="Items"
            class="pairs"
            rows={shown}
            rowKey={(row) => row.item}
            loading="the answers"
            empty="No answers yet."
            columns={[
              { label: "#", num: true, cell: (row) => String(row.item + 1) },
              { label: "Question", cell: (row) => row.input },
              { label: "Expected", cell: (row) => row.expected },
              ...run.models.map((model, m) => ({
                label: model,
                cell: (row: ItemRow) => {
                  const answer = row.answers[m];
                  if (!answer) return "…";
                  const pass = answer.scores[0]?.passed === true;
                  return (
                    <div class={pass ? "answer pass" : "answer fail"}>
                      <div>{answer.error ? `error: ${answer.error}` : answer.answer}</div>
                      <small class="muted" title={judgeNotes(answer.scores) || undefined}>
                        {`${pass ? "✓" : "✗"} ${formatScores(answer.scores)}`}
                      </small>
                    </div>
                  );
                },
              })),
            ]}
          />
        </>
      )}
    </div>
  );
}
