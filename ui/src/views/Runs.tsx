import { useEffect, useState } from "preact/hooks";
import type { InputHTMLAttributes } from "preact";
import { api, isLive, type CreateRunBody, type RunSummary } from "../api.ts";
import { ErrorNote, Field, StatusBadge } from "../components/common.tsx";
import { Table, type Column } from "../components/Table.tsx";
import { formatTime } from "../format.ts";
import { useAction, useInterval, useResource, type Resource } from "../hooks.ts";
import { Link, navigate } from "../router.tsx";

/** The list of runs (summaries: no log, no loss series), fetched again every 3 s while any is live. */
function useRuns(): Resource<RunSummary[]> {
  const runs = useResource(() => api.listRuns({ limit: 1000 }), []);
  const live = (runs.data ?? []).some((r) => isLive(r.status));
  useInterval(() => runs.reload(), 3000, live);
  return runs;
}

const runColumns: Column<RunSummary>[] = [
  { label: "Name", cell: (r) => <Link href={`/ui/runs/${encodeURIComponent(r.id)}`}>{r.name}</Link> },
  { label: "Status", cell: (r) => <StatusBadge status={r.status} /> },
  { label: "Dataset", cell: (r) => r.datasetName },
  { label: "Base model", cell: (r) => String(r.config.baseModelName ?? "") },
  { label: "Created", cell: (r) => formatTime(r.createdAt) },
];

/** Fine-tuning runs: the creation form and the list, refreshed while any run is live. */
export function Runs({ datasetId }: { datasetId: string | null }) {
  const runs = useRuns();
  return (
    <div class="page">
      <h1>Fine-tuning runs</h1>
      <RunForm datasetId={datasetId} />
      <h2>Runs</h2>
      <ErrorNote message={runs.error} />
      <Table
        label="Runs"
        columns={runColumns}
        rows={runs.data}
        rowKey={(r) => r.id}
        loading={runs.error ? undefined : "runs"}
        empty="No runs yet."
      />
    </div>
  );
}

/**
 * Every field of `POST /conduit/finetuning` the form offers, as text so an empty field means "the
 * default" (and `auto` lets the server choose epochs, learning rate and rank).
 */
interface FormState {
  datasetID: string;
  baseModelName: string;
  lr: string;
  epochs: string;
  steps: string;
  method: NonNullable<CreateRunBody["method"]>;
  loraRank: string;
  loraAlpha: string;
  complexity: string;
  trainOnInputs: boolean;
  earlyStoppingPatience: string;
  systemPrompt: string;
  judgeModel: string;
  name: string;
  trackerProject: string;
  trackerEntity: string;
}

type TextField = Exclude<keyof FormState, "trainOnInputs">;

/** The form's first values: the API's documented defaults (the request schema's descriptions). */
const defaults = {
  lr: "auto",
  epochs: "auto",
  steps: "",
  method: "lora" as NonNullable<CreateRunBody["method"]>,
  loraRank: "auto",
  loraAlpha: "",
  complexity: "1",
  trainOnInputs: false,
  earlyStoppingPatience: "",
};

/** What a number-or-auto field accepts (the browser checks it before the form is sent). */
const numberOrAutoPattern = "\\s*(auto|[0-9]*\\.?[0-9]+([eE][+\\-]?[0-9]+)?)\\s*";

/** A number-or-auto field's value: `undefined` (the server's "auto") unless a number is typed. */
function numberOrAuto(text: string): number | undefined {
  const value = text.trim();
  return value === "" || value === "auto" ? undefined : Number(value);
}

/** The request body: numbers parsed, empty optional fields left out so the server's defaults apply. */
function runBody(form: FormState): CreateRunBody {
  const body: CreateRunBody = { datasetID: form.datasetID };
  if (form.baseModelName) body.baseModelName = form.baseModelName;
  const lr = numberOrAuto(form.lr);
  if (lr !== undefined) body.lr = lr;
  const epochs = numberOrAuto(form.epochs);
  if (epochs !== undefined) body.epochs = epochs;
  if (form.steps.trim()) body.steps = Number(form.steps);
  body.method = form.method;
  // The LoRA settings belong to LoRA runs only (the server refuses them with "full").
  const loraRank = numberOrAuto(form.loraRank);
  if (form.method === "lora" && loraRank !== undefined) body.loraRank = loraRank;
  if (form.method === "lora" && form.loraAlpha.trim()) body.loraAlpha = Number(form.loraAlpha);
  if (form.complexity.trim()) body.complexity = Number(form.complexity);
  if (form.trainOnInputs) body.trainOnInputs = true;
  if (form.earlyStoppingPatience.trim()) body.earlyStoppingPatience = Number(form.earlyStoppingPatience);
  if (form.systemPrompt) body.systemPrompt = form.systemPrompt;
  if (form.judgeModel) body.judgeModel = form.judgeModel;
  if (form.name.trim()) body.name = form.name.trim();
  if (form.trackerProject.trim()) body.trackerProject = form.trackerProject.trim();
  if (form.trackerEntity.trim()) body.trackerEntity = form.trackerEntity.trim();
  return body;
}

function RunForm({ datasetId }: { datasetId: string | null }) {
  const options = useResource(async () => {
    const [datasets, models] = await Promise.all([api.listDatasets({ limit: 1000 }), api.listModels()]);
    return { datasets, models: models.filter((m) => m.kind === "base"), judges: models };
  }, []);
  const [form, setForm] = useState<FormState>({
    datasetID: datasetId ?? "",
    baseModelName: "",
    systemPrompt: "",
    judgeModel: "",
    name: "",
    trackerProject: "",
    trackerEntity: "",
    ...defaults,
  });
  const create = useAction();
  // Preselect the first model: a server without CONDUIT_DEFAULT_MODEL needs one named.
  const firstModel = options.data?.models[0]?.id;
  useEffect(() => {
    if (firstModel) setForm((f) => (f.baseModelName ? f : { ...f, baseModelName: firstModel }));
  }, [firstModel]);
  const set = (field: TextField) => (event: Event) => {
    const value = (event.currentTarget as HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement).value;
    setForm((f) => ({ ...f, [field]: value }));
  };
  const submit = async (event: Event) => {
    event.preventDefault();
    const run = await create.run(() => api.createRun(runBody(form)));
    if (run) navigate(`/ui/runs/${encodeURIComponent(run.id)}`);
  };

  const datasets = options.data?.datasets ?? [];
  const models = options.data?.models ?? [];
  const text = (field: TextField, extra: InputHTMLAttributes<HTMLInputElement> = {}) => (
    <input name={field} value={form[field]} onInput={set(field)} {...extra} />
  );
  // Typed as text: "auto" or a number.
  const numberOrAutoInput = (field: "lr" | "epochs" | "loraRank") =>
    text(field, {
      inputMode: "decimal",
      pattern: numberOrAutoPattern,
      placeholder: "auto",
      autoComplete: "off",
      spellcheck: false,
      title: 'A number, or "auto"',
    });

  return (
    <form class="card run-form" onSubmit={submit} aria-labelledby="new-run">
      <h2 id="new-run">Start a run</h2>
      <ErrorNote message={options.error} />
      <div class="grid">
        <Field
          label="Dataset"
          hint={datasets.length === 0 && options.data ? "Create a dataset first." : undefined}
        >
          <select name="datasetID" required value={form.datasetID} onChange={set("datasetID")}>
            <option value="">Choose a dataset…</option>
            {datasets.map((d) => (
              <option key={d.id} value={d.id}>{`${d.name} (${d.ioPairsCount} pairs)`}</option>
            ))}
          </select>
        </Field>
        <Field label="Base model" hint="Defaults to the server's CONDUIT_DEFAULT_MODEL.">
          <select name="baseModelName" value={form.baseModelName} onChange={set("baseModelName")}>
            <option value="">Server default</option>
            {models.map((m) => (
              <option key={m.id} value={m.id}>
                {m.id}
              </option>
            ))}
          </select>
        </Field>
        <Field
          label="Learning rate"
          hint="In (0, 1], or auto: chosen from the model's width and the method. Default auto."
        >
          {numberOrAutoInput("lr")}
        </Field>
        <Field
          label="Epochs"
          hint="Passes over the data, 1 to 1000, or auto: more for a small dataset, fewer for a large one. Default auto."
        >
          {numberOrAutoInput("epochs")}
        </Field>
        <Field label="Steps" hint="Cap on optimizer steps. Default: no cap.">
          {text("steps", { type: "number", step: "1", min: "1", placeholder: "no cap" })}
        </Field>
        <Field
          label="Method"
          hint="LoRA trains a small adapter on the frozen base model; full trains every weight. Default LoRA."
        >
          <select name="method" value={form.method} onChange={set("method")}>
            <option value="lora">LoRA adapter</option>
            <option value="full">Full fine-tune</option>
          </select>
        </Field>
        {form.method === "lora" && (
          <Field
            label="LoRA rank"
            hint="1 to 256, or auto: chosen from the dataset's size and the model's width. Default auto."
          >
            {numberOrAutoInput("loraRank")}
          </Field>
        )}
        {form.method === "lora" && (
          <Field
            label="LoRA alpha"
            hint="The adapter is scaled by alpha / rank; in (0, 4096]. Default 2 × rank."
          >
            {text("loraAlpha", {
              type: "number",
              step: "any",
              min: "0",
              max: "4096",
              inputMode: "decimal",
              placeholder: "2 × rank",
            })}
          </Field>
        )}
        <Field
          label="Complexity"
          hint="Fraction of the top transformer blocks that get adapters (LoRA) or train (full), in (0, 1]. Default 1."
        >
          {text("complexity", { type: "number", step: "any", min: "0", max: "1", inputMode: "decimal" })}
        </Field>
        <Field
          label="Early stopping"
          hint="Stop after this many evaluations in a row without a new best eval loss, 1 to 100. Default: never."
        >
          {text("earlyStoppingPatience", {
            type: "number",
            step: "1",
            min: "1",
            max: "100",
            placeholder: "never",
          })}
        </Field>
        <Field
          label="Train on inputs"
          hint="Train on the whole conversation, prompts included. Default: off, only the answers count."
          check
        >
          <input
            type="checkbox"
            name="trainOnInputs"
            checked={form.trainOnInputs}
            onChange={(event) => {
              const checked = event.currentTarget.checked;
              setForm((f) => ({ ...f, trainOnInputs: checked }));
            }}
          />
        </Field>
        <Field
          label="Judge model"
          hint="Also grades the before/after once the run is READY, scoring each answer from 0 to 1. Default: none."
        >
          <select name="judgeModel" value={form.judgeModel} onChange={set("judgeModel")}>
            <option value="">None</option>
            {(options.data?.judges ?? []).map((m) => (
              <option key={m.id} value={m.id}>
                {m.id}
              </option>
            ))}
          </select>
        </Field>
        <Field label="Name" hint="Default: <dataset>-<model>.">
          {text("name", { maxLength: 256, placeholder: "dataset-model" })}
        </Field>
        <Field label="Tracker project" hint="Optional.">
          {text("trackerProject", { maxLength: 256 })}
        </Field>
        <Field label="Tracker entity" hint="Optional.">
          {text("trackerEntity", { maxLength: 256 })}
        </Field>
        <Field label="System prompt" hint="Trained with and served with. Default: none." wide>
          <textarea name="systemPrompt" rows={3} value={form.systemPrompt} onInput={set("systemPrompt")} />
        </Field>
      </div>
      <ErrorNote message={create.error} />
      <button type="submit" class="primary" disabled={create.busy || !options.data}>
        {create.busy ? "Starting…" : "Start run"}
      </button>
    </form>
  );
}
