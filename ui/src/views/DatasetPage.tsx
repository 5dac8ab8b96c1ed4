import { useEffect, useRef, useState } from "preact/hooks";
import { api, type Dataset, type DatasetFile, type IoPairPreview } from "../api.ts";
import { ErrorNote, Field, Loading } from "../components/common.tsx";
import { Table, type Column } from "../components/Table.tsx";
import { formatBytes, formatTime } from "../format.ts";
import { useAction, useResource } from "../hooks.ts";
import { Link, navigate } from "../router.tsx";

/** One dataset: rename, delete, upload files (with progress), and preview each file's pairs. */
export function DatasetPage({ id }: { id: string }) {
  const dataset = useResource(() => api.getDataset(id), [id]);
  const files = useResource(() => api.listFiles(id, { limit: 1000 }), [id]);
  const [preview, setPreview] = useState<DatasetFile>();
  const remove = useAction();
  const removeFile = useAction();

  const back = (
    <p>
      <Link href="/ui/datasets">← Datasets</Link>
    </p>
  );
  if (dataset.data === undefined)
    return (
      <div class="page">
        {back}
        {dataset.error ? <ErrorNote message={dataset.error} /> : <Loading what="the dataset" />}
      </div>
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

  const columns: Column<DatasetFile>[] = [
    { label: "Name", cell: (f) => f.name },
    { label: "Format", cell: (f) => f.format.toUpperCase() },
    { label: "IO pairs", num: true, cell: (f) => f.ioPairsCount },
    { label: "Size", num: true, cell: (f) => formatBytes(f.size) },
    { label: "Uploaded", cell: (f) => formatTime(f.createdAt) },
    {
      label: "Actions",
      actions: true,
      cell: (f) => (
        <>
          <button type="button" onClick={() => setPreview(f)} aria-pressed={preview?.id === f.id}>
            Preview<span class="visually-hidden">{` ${f.name}`}</span>
          </button>
          <button type="button" class="danger" onClick={() => deleteFile(f)}>
            Delete<span class="visually-hidden">{` ${f.name}`}</span>
          </button>
        </>
      ),
    },
  ];

  return (
    <div class="page">
      {back}
      <h1>{d.name}</h1>
      <p class="muted">
        {`${d.ioPairsCount} IO pairs · created ${formatTime(d.createdAt)} · `}
        <code>{d.id}</code>
      </p>
      <div class="toolbar">
        <Link href={`/ui/runs?dataset=${encodeURIComponent(d.id)}`} class="button primary">
          Train on it
        </Link>
        <button type="button" class="danger" onClick={deleteDataset} disabled={remove.busy}>
          Delete dataset
        </button>
      </div>
      <ErrorNote message={remove.error} />
      <div class="columns">
        <Rename dataset={d} onRenamed={dataset.reload} />
        <Upload datasetId={d.id} onUploaded={refresh} />
      </div>
      <h2>Files</h2>
      <ErrorNote message={files.error ?? removeFile.error} />
      <Table
        label="Files"
        columns={columns}
        rows={files.data}
        rowKey={(f) => f.id}
        rowClass={(f) => (preview?.id === f.id ? "selected" : undefined)}
        loading={files.error ? undefined : "files"}
        empty="No files yet: upload JSONL, a JSON array or CSV with input and output columns."
      />
      {preview ? <PairsPreview key={preview.id} datasetId={d.id} file={preview} /> : null}
    </div>
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
  return (
    <form class="card" onSubmit={submit} aria-labelledby="rename-heading">
      <h2 id="rename-heading">Rename</h2>
      <Field label="New name">
        <input required maxLength={256} value={name} onInput={(e) => setName(e.currentTarget.value)} />
      </Field>
      <button type="submit" disabled={action.busy || name.trim() === dataset.name}>
        Rename
      </button>
      <ErrorNote message={action.error} />
      {done ? (
        <p class="note ok" role="status">
          Renamed.
        </p>
      ) : null}
    </form>
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
    const uploaded = await action.run(() =>
      api.uploadFile(datasetId, file, {
        name: file.name,
        onProgress: (sent, total) => setProgress(total ? sent / total : 0),
      }),
    );
    setProgress(undefined);
    if (uploaded) {
      setResult(`Uploaded ${uploaded.name}: ${uploaded.ioPairsCount} IO pairs.`);
      if (input.current) input.current.value = "";
      onUploaded();
    }
  };
  const percent = progress === undefined ? 0 : Math.round(progress * 100);
  return (
    <form class="card" onSubmit={submit} aria-labelledby="upload-heading">
      <h2 id="upload-heading">Upload a file</h2>
      <Field label="File" hint="JSONL, a JSON array, or CSV with input and output columns.">
        <input ref={input} type="file" accept=".jsonl,.ndjson,.json,.csv,.txt" />
      </Field>
      <button type="submit" class="primary" disabled={action.busy}>
        {action.busy ? "Uploading…" : "Upload"}
      </button>
      {progress !== undefined ? (
        <div class="progress-row">
          <progress max={100} value={percent} aria-label="Upload progress" />
          <span aria-hidden="true">{`${percent}%`}</span>
        </div>
      ) : null}
      {action.error ? (
        <p class="note error" role="alert">
          <strong>The file was not accepted: </strong>
          {action.error}
        </p>
      ) : null}
      {result ? (
        <p class="note ok" role="status">
          {result}
        </p>
      ) : null}
    </form>
  );
}

const pageSize = 50;

const pairColumns: Column<IoPairPreview>[] = [
  { label: "Line", num: true, cell: (p) => p.line },
  { label: "Input", cell: (p) => p.input },
  { label: "Output", cell: (p) => p.output },
];

function PairsPreview({ datasetId, file }: { datasetId: string; file: DatasetFile }) {
  const [pairs, setPairs] = useState<IoPairPreview[]>([]);
  const action = useAction();
  const heading = useRef<HTMLHeadingElement>(null);
  const loadMore = async (offset: number) => {
    const page = await action.run(() => api.listPairs(datasetId, file.id, { limit: pageSize, offset }));
    if (page) setPairs((previous) => [...previous, ...page]);
  };
  useEffect(() => {
    void loadMore(0);
    heading.current?.focus();
    // Loads once per file (the component is keyed by the file id).
  }, []);
  return (
    <section class="preview" aria-labelledby="preview-heading">
      <h2 id="preview-heading" ref={heading} tabIndex={-1}>
        {`Preview of ${file.name}`}
      </h2>
      <ErrorNote message={action.error} />
      <Table
        label={`Pairs of ${file.name}`}
        class="pairs"
        columns={pairColumns}
        rows={pairs}
        rowKey={(p) => p.line}
      />
      <p class="muted">
        {`Showing ${pairs.length} of ${file.ioPairsCount} pairs. `}
        {pairs.length < file.ioPairsCount ? (
          <button type="button" onClick={() => loadMore(pairs.length)} disabled={action.busy}>
            Show more
          </button>
        ) : null}
      </p>
    </section>
  );
}
