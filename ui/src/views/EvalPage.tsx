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

/** An eval: its runs, a table per model (each grader's totals), and every item with each model's answer. */
export function EvalPage({ id, runId }: { id: string; runId: string | null }) {
  const evaluation = useResource(() => api.getEval(id), [id]);
  const runs = useResource(() => api.listEvalRuns(id), [id]);
  const [chosen, setChosen] = useState(runId);
  const run = runs.data?.find((r) => r.id === chosen) ?? runs.data?.[0];
  const results = useResource(
    () => (run ? api.evalResults(id, run.id, { limit: 10_000 }) : Promise.resolve([])),
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
