import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { api, uploadFile, type Dataset, type DatasetFile, type IoPairPreview } from "../api.ts";
import { ErrorNote, Field, Loading, TableScroll } from "../components/common.ts";
import { formatBytes, formatTime } from "../format.ts";
import { useAction, useResource } from "../hooks.ts";
import { Link, navigate } from "../router.ts";

/** One dataset: rename, delete, upload files (with progress), and preview each file's pairs. */
export function DatasetPage({ id }: { id: string }) {
  const dataset = useResource(() => api.dataset(id), [id]);
  const files = useResource(() => api.files(id), [id]);
  const [preview, setPreview] = useState<DatasetFile>();
  const remove = useAction();
  const removeFile = useAction();

  if (dataset.data === undefined)
    return h(
      "div",
      { class: "page" },
      h("p", null, h(Link, { href: "/ui/datasets" }, "← Datasets")),
      dataset.error ? h(ErrorNote, { message: dataset.error }) : h(Loading, { what: "the dataset" }),
    );
  const d = dataset.data;
  const refresh = () => {
    dataset.reload();
    files.reload();
  };
  const deleteDataset = async () => {
    if (!confirm(`Delete dataset "${d.name}" and all its files?`)) return;
    if (await remove.run(() => api.deleteDataset(d.id))) navigate("/ui/datasets");
  };
  const deleteFile = async (file: DatasetFile) => {
    if (!confirm(`Delete file "${file.name}"?`)) return;
    await removeFile.run(() => api.deleteFile(d.id, file.id));
    if (preview?.id === file.id) setPreview(undefined);
    refresh();
  };

  return h(
    "div",
    { class: "page" },
    h("p", null, h(Link, { href: "/ui/datasets" }, "← Datasets")),
    h("h1", null, d.name),
    h(
      "p",
      { class: "muted" },
      `${d.ioPairsCount} IO pairs · created ${formatTime(d.createdAt)} · `,
      h("code", null, d.id),
    ),
    h(
      "div",
      { class: "toolbar" },
      h(
        Link,
        { href: `/ui/runs?dataset=${encodeURIComponent(d.id)}`, class: "button primary" },
        "Train on it",
      ),
      h(
        "button",
        { type: "button", class: "danger", onClick: deleteDataset, disabled: remove.busy },
        "Delete dataset",
      ),
    ),
    h(ErrorNote, { message: remove.error }),
    h(
      "div",
      { class: "columns" },
      h(Rename, { dataset: d, onRenamed: dataset.reload }),
      h(Upload, { datasetId: d.id, onUploaded: refresh }),
    ),
    h("h2", null, "Files"),
    h(ErrorNote, { message: files.error ?? removeFile.error }),
    files.data === undefined
      ? files.error
        ? null
        : h(Loading, { what: "files" })
      : files.data.length === 0
        ? h(
            "p",
            { class: "muted" },
            "No files yet: upload JSONL, a JSON array or CSV with input and output columns.",
          )
        : h(
            TableScroll,
            { label: "Files" },
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
                  h("th", { scope: "col" }, "Format"),
                  h("th", { scope: "col", class: "num" }, "IO pairs"),
                  h("th", { scope: "col", class: "num" }, "Size"),
                  h("th", { scope: "col" }, "Uploaded"),
                  h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")),
                ),
              ),
              h(
                "tbody",
                null,
                files.data.map((f) =>
                  h(
                    "tr",
                    { key: f.id, class: preview?.id === f.id ? "selected" : undefined },
                    h("td", { "data-label": "Name" }, f.name),
                    h("td", { "data-label": "Format" }, f.format.toUpperCase()),
                    h("td", { class: "num", "data-label": "IO pairs" }, f.ioPairsCount),
                    h("td", { class: "num", "data-label": "Size" }, formatBytes(f.size)),
                    h("td", { "data-label": "Uploaded" }, formatTime(f.createdAt)),
                    h(
                      "td",
                      { class: "actions" },
                      h(
                        "button",
                        {
                          type: "button",
                          onClick: () => setPreview(f),
                          "aria-pressed": preview?.id === f.id,
                        },
                        "Preview",
                        h("span", { class: "visually-hidden" }, ` ${f.name}`),
                      ),
                      h(
                        "button",
                        { type: "button", class: "danger", onClick: () => deleteFile(f) },
                        "Delete",
                        h("span", { class: "visually-hidden" }, ` ${f.name}`),
                      ),
                    ),
                  ),
                ),
              ),
            ),
          ),
    preview ? h(PairsPreview, { key: preview.id, datasetId: d.id, file: preview }) : null,
  );
}

function Rename({ dataset, onRenamed }: { dataset: Dataset; onRenamed: () => void }) {
  const [name, setName] = useState(dataset.name);
  const action = useAction();
  const [done, setDone] = useState(false);
  const submit = async (event: Event) => {
    event.preventDefault();
    setDone(false);
    if (await action.run(() => api.renameDataset(dataset.id, name.trim()))) {
      setDone(true);
      onRenamed();
    }
  };
  return h(
    "form",
    { class: "card", onSubmit: submit, "aria-labelledby": "rename-heading" },
    h("h2", { id: "rename-heading" }, "Rename"),
    h(
      Field,
      { label: "New name" },
      h("input", {
        required: true,
        maxLength: 256,
        value: name,
        onInput: (e: Event) => setName((e.currentTarget as HTMLInputElement).value),
      }),
    ),
    h("button", { type: "submit", disabled: action.busy || name.trim() === dataset.name }, "Rename"),
    h(ErrorNote, { message: action.error }),
    done ? h("p", { class: "note ok", role: "status" }, "Renamed.") : null,
  );
}

/** A file upload with a progress bar; a refused file shows the server's reason, which names the line. */
function Upload({ datasetId, onUploaded }: { datasetId: string; onUploaded: () => void }) {
  const input = useRef<HTMLInputElement>(null);
  const [progress, setProgress] = useState<number>();
  const [result, setResult] = useState<string>();
  const action = useAction();
  const submit = async (event: Event) => {
    event.preventDefault();
    const file = input.current?.files?.[0];
    if (!file) {
      action.setError("Choose a file first.");
      return;
    }
    setResult(undefined);
    setProgress(0);
    const uploaded = await action.run(() => uploadFile(datasetId, file, setProgress));
    setProgress(undefined);
    if (uploaded) {
      setResult(`Uploaded ${uploaded.name}: ${uploaded.ioPairsCount} IO pairs.`);
      if (input.current) input.current.value = "";
      onUploaded();
    }
  };
  const percent = progress === undefined ? 0 : Math.round(progress * 100);
  return h(
    "form",
    { class: "card", onSubmit: submit, "aria-labelledby": "upload-heading" },
    h("h2", { id: "upload-heading" }, "Upload a file"),
    h(
      Field,
      { label: "File", hint: "JSONL, a JSON array, or CSV with input and output columns." },
      h("input", { ref: input, type: "file", accept: ".jsonl,.ndjson,.json,.csv,.txt" }),
    ),
    h(
      "button",
      { type: "submit", class: "primary", disabled: action.busy },
      action.busy ? "Uploading…" : "Upload",
    ),
    progress !== undefined
      ? h(
          "div",
          { class: "progress-row" },
          h("progress", { max: 100, value: percent, "aria-label": "Upload progress" }),
          h("span", { "aria-hidden": "true" }, `${percent}%`),
        )
      : null,
    action.error
      ? h(
          "p",
          { class: "note error", role: "alert" },
          h("strong", null, "The file was not accepted: "),
          action.error,
        )
      : null,
    result ? h("p", { class: "note ok", role: "status" }, result) : null,
  );
}

const pageSize = 50;

function PairsPreview({ datasetId, file }: { datasetId: string; file: DatasetFile }) {
  const [pairs, setPairs] = useState<IoPairPreview[]>([]);
  const action = useAction();
  const heading = useRef<HTMLHeadingElement>(null);
  const loadMore = async (offset: number) => {
    const page = await action.run(() => api.pairs(datasetId, file.id, pageSize, offset));
    if (page) setPairs((previous) => [...previous, ...page]);
  };
  useEffect(() => {
    void loadMore(0);
    heading.current?.focus();
    // Loads once per file (the component is keyed by the file id).
  }, []);
  return h(
    "section",
    { class: "preview", "aria-labelledby": "preview-heading" },
    h("h2", { id: "preview-heading", ref: heading, tabIndex: -1 }, `Preview of ${file.name}`),
    h(ErrorNote, { message: action.error }),
    h(
      TableScroll,
      { label: `Pairs of ${file.name}` },
      h(
        "table",
        { class: "pairs stack" },
        h(
          "thead",
          null,
          h(
            "tr",
            null,
            h("th", { scope: "col", class: "num" }, "Line"),
            h("th", { scope: "col" }, "Input"),
            h("th", { scope: "col" }, "Output"),
          ),
        ),
        h(
          "tbody",
          null,
          pairs.map((p) =>
            h(
              "tr",
              { key: p.line },
              h("td", { class: "num", "data-label": "Line" }, p.line),
              h("td", { "data-label": "Input" }, p.input),
              h("td", { "data-label": "Output" }, p.output),
            ),
          ),
        ),
      ),
    ),
    h(
      "p",
      { class: "muted" },
      `Showing ${pairs.length} of ${file.ioPairsCount} pairs. `,
      pairs.length < file.ioPairsCount
        ? h(
            "button",
            { type: "button", onClick: () => loadMore(pairs.length), disabled: action.busy },
            "Show more",
          )
        : null,
    ),
  );
}
