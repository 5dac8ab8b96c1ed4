import { h } from "preact";
import { useEffect, useState } from "preact/hooks";
import { api, isLive, type CreateRunBody, type Dataset, type Model, type RunSummary } from "../api.ts";
import { runDefaults } from "../../../src/contract/runs.ts";
import { ErrorNote, Field, Loading, StatusBadge, TableScroll } from "../components/common.ts";
import { formatTime } from "../format.ts";
import { useAction, useInterval, useResource, type Resource } from "../hooks.ts";
import { Link, navigate } from "../router.ts";

/** The list of runs (summaries: no log, no loss series), fetched again every 3 s while any is live. */
function useRuns(): Resource<RunSummary[]> {
  const runs = useResource(() => api.runs(), []);
  const live = (runs.data ?? []).some((r) => isLive(r.status));
  useInterval(() => runs.reload(), 3000, live);
  return runs;
}

/** Fine-tuning runs: the creation form and the list, refreshed while any run is live. */
export function Runs({ datasetId }: { datasetId: string | null }) {
  const runs = useRuns();
  return h(
    "div",
    { class: "page" },
    h("h1", null, "Fine-tuning runs"),
    h(RunForm, { datasetId }),
    h("h2", null, "Runs"),
    h(ErrorNote, { message: runs.error }),
    runs.data === undefined
      ? runs.error
        ? null
        : h(Loading, { what: "runs" })
      : runs.data.length === 0
        ? h("p", { class: "muted" }, "No runs yet.")
        : h(RunTable, { runs: runs.data }),
  );
}

function RunTable({ runs }: { runs: RunSummary[] }) {
  return h(
    TableScroll,
    { label: "Runs" },
    h(
      "table",
      { class: "stack" },
      h(
        "thead",
        null,
        h(
          "tr",
          null,
          h("th", { scope: "col" }, "Name"),
          h("th", { scope: "col" }, "Status"),
          h("th", { scope: "col" }, "Dataset"),
          h("th", { scope: "col" }, "Base model"),
          h("th", { scope: "col" }, "Created"),
        ),
      ),
      h(
        "tbody",
        null,
        runs.map((r) =>
          h(
            "tr",
            { key: r.id },
            h(
              "td",
              { "data-label": "Name" },
              h(Link, { href: `/ui/runs/${encodeURIComponent(r.id)}` }, r.name),
            ),
            h("td", { "data-label": "Status" }, h(StatusBadge, { status: r.status })),
            h("td", { "data-label": "Dataset" }, r.datasetName),
            h("td", { "data-label": "Base model" }, String(r.config.baseModelName ?? "")),
            h("td", { "data-label": "Created" }, formatTime(r.createdAt)),
          ),
        ),
      ),
    ),
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
  name: string;
  trackerProject: string;
  trackerEntity: string;
}

const defaults = {
  lr: "auto",
  epochs: "auto",
  steps: "",
  method: runDefaults.method,
  loraRank: "auto",
  loraAlpha: "",
  complexity: String(runDefaults.complexity),
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
  if (form.name.trim()) body.name = form.name.trim();
  if (form.trackerProject.trim()) body.trackerProject = form.trackerProject.trim();
  if (form.trackerEntity.trim()) body.trackerEntity = form.trackerEntity.trim();
  return body;
}

function RunForm({ datasetId }: { datasetId: string | null }) {
  const options = useResource(async () => {
    const [datasets, models] = await Promise.all([api.datasets(), api.models()]);
    return { datasets, models: models.filter((m) => m.kind === "base") };
  }, []);
  const [form, setForm] = useState<FormState>({
    datasetID: datasetId ?? "",
    baseModelName: "",
    systemPrompt: "",
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
  const set = (field: Exclude<keyof FormState, "trainOnInputs">) => (event: Event) => {
    const value = (event.currentTarget as HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement).value;
    setForm((f) => ({ ...f, [field]: value }));
  };
  const submit = async (event: Event) => {
    event.preventDefault();
    const run = await create.run(() => api.createRun(runBody(form)));
    if (run) navigate(`/ui/runs/${encodeURIComponent(run.id)}`);
  };

  const datasets: Dataset[] = options.data?.datasets ?? [];
  const models: Model[] = options.data?.models ?? [];
  const text = (field: Exclude<keyof FormState, "trainOnInputs">, extra: Record<string, unknown> = {}) =>
    h("input", { name: field, value: form[field], onInput: set(field), ...extra });
  // Typed as text: "auto" or a number.
  const numberOrAutoInput = (field: "lr" | "epochs" | "loraRank") =>
    text(field, {
      inputMode: "decimal",
      pattern: numberOrAutoPattern,
      placeholder: "auto",
      autoComplete: "off",
      spellCheck: false,
      title: 'A number, or "auto"',
    });

  return h(
    "form",
    { class: "card run-form", onSubmit: submit, "aria-labelledby": "new-run" },
    h("h2", { id: "new-run" }, "Start a run"),
    h(ErrorNote, { message: options.error }),
    h(
      "div",
      { class: "grid" },
      h(
        Field,
        {
          label: "Dataset",
          hint: datasets.length === 0 && options.data ? "Create a dataset first." : undefined,
        },
        h(
          "select",
          { name: "datasetID", required: true, value: form.datasetID, onChange: set("datasetID") },
          h("option", { value: "" }, "Choose a dataset…"),
          datasets.map((d) => h("option", { key: d.id, value: d.id }, `${d.name} (${d.ioPairsCount} pairs)`)),
        ),
      ),
      h(
        Field,
        { label: "Base model", hint: "Defaults to the server's CONDUIT_DEFAULT_MODEL." },
        h(
          "select",
          { name: "baseModelName", value: form.baseModelName, onChange: set("baseModelName") },
          h("option", { value: "" }, "Server default"),
          models.map((m) => h("option", { key: m.id, value: m.id }, m.id)),
        ),
      ),
      h(
        Field,
        {
          label: "Learning rate",
          hint: "In (0, 1], or auto: chosen from the model's width and the method. Default auto.",
        },
        numberOrAutoInput("lr"),
      ),
      h(
        Field,
        {
          label: "Epochs",
          hint: "Passes over the data, 1 to 1000, or auto: more for a small dataset, fewer for a large one. Default auto.",
        },
        numberOrAutoInput("epochs"),
      ),
      h(
        Field,
        { label: "Steps", hint: "Cap on optimizer steps. Default: no cap." },
        text("steps", { type: "number", step: "1", min: "1", placeholder: "no cap" }),
      ),
      h(
        Field,
        {
          label: "Method",
          hint: "LoRA trains a small adapter on the frozen base model; full trains every weight. Default LoRA.",
        },
        h(
          "select",
          { name: "method", value: form.method, onChange: set("method") },
          h("option", { value: "lora" }, "LoRA adapter"),
          h("option", { value: "full" }, "Full fine-tune"),
        ),
      ),
      form.method === "lora" &&
        h(
          Field,
          {
            label: "LoRA rank",
            hint: "1 to 256, or auto: chosen from the dataset's size and the model's width. Default auto.",
          },
          numberOrAutoInput("loraRank"),
        ),
      form.method === "lora" &&
        h(
          Field,
          {
            label: "LoRA alpha",
            hint: "The adapter is scaled by alpha / rank; in (0, 4096]. Default 2 × rank.",
          },
          text("loraAlpha", {
            type: "number",
            step: "any",
            min: "0",
            max: "4096",
            inputMode: "decimal",
            placeholder: "2 × rank",
          }),
        ),
      h(
        Field,
        {
          label: "Complexity",
          hint: "Fraction of the top transformer blocks that get adapters (LoRA) or train (full), in (0, 1]. Default 1.",
        },
        text("complexity", { type: "number", step: "any", min: "0", max: "1", inputMode: "decimal" }),
      ),
      h(
        Field,
        {
          label: "Early stopping",
          hint: "Stop after this many evaluations in a row without a new best eval loss, 1 to 100. Default: never.",
        },
        text("earlyStoppingPatience", {
          type: "number",
          step: "1",
          min: "1",
          max: "100",
          placeholder: "never",
        }),
      ),
      h(
        Field,
        {
          label: "Train on inputs",
          hint: "Train on the whole conversation, prompts included. Default: off, only the answers count.",
          check: true,
        },
        h("input", {
          type: "checkbox",
          name: "trainOnInputs",
          checked: form.trainOnInputs,
          onChange: (event: Event) => {
            const checked = (event.currentTarget as HTMLInputElement).checked;
            setForm((f) => ({ ...f, trainOnInputs: checked }));
          },
        }),
      ),
      h(
        Field,
        { label: "Name", hint: "Default: <dataset>-<model>." },
        text("name", { maxLength: 256, placeholder: "dataset-model" }),
      ),
      h(Field, { label: "Tracker project", hint: "Optional." }, text("trackerProject", { maxLength: 256 })),
      h(Field, { label: "Tracker entity", hint: "Optional." }, text("trackerEntity", { maxLength: 256 })),
      h(
        Field,
        { label: "System prompt", hint: "Trained with and served with. Default: none.", wide: true },
        h("textarea", {
          name: "systemPrompt",
          rows: 3,
          value: form.systemPrompt,
          onInput: set("systemPrompt"),
        }),
      ),
    ),
    h(ErrorNote, { message: create.error }),
    h(
      "button",
      { type: "submit", class: "primary", disabled: create.busy || !options.data },
      create.busy ? "Starting…" : "Start run",
    ),
  );
}
