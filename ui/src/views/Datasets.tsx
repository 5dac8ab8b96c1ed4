import { useState } from "preact/hooks";
import { api, type Dataset } from "../api.ts";
import { ErrorNote, Field } from "../components/common.tsx";
import { Table, type Column } from "../components/Table.tsx";
import { formatTime } from "../format.ts";
import { useAction, useResource } from "../hooks.ts";
import { Link, navigate } from "../router.tsx";

/** Your datasets, and a form to create one (it opens the new dataset, ready for uploads). */
export function Datasets() {
  const datasets = useResource(() => api.listDatasets({ limit: 1000 }), []);
  const [name, setName] = useState("");
  const create = useAction();
  const remove = useAction();

  const submit = async (event: Event) => {
    event.preventDefault();
    const dataset = await create.run(() => api.createDataset(name.trim()));
    if (dataset) navigate(`/ui/datasets/${encodeURIComponent(dataset.id)}`);
  };
  const deleteDataset = async (d: Dataset) => {
    if (!confirm(`Delete dataset "${d.name}" and all its files?`)) return;
    await remove.run(() => api.deleteDataset(d.id));
    datasets.reload();
  };

  const columns: Column<Dataset>[] = [
    { label: "Name", cell: (d) => <Link href={`/ui/datasets/${encodeURIComponent(d.id)}`}>{d.name}</Link> },
    { label: "IO pairs", num: true, cell: (d) => d.ioPairsCount },
    { label: "Created", cell: (d) => formatTime(d.createdAt) },
    {
      label: "Actions",
      actions: true,
      cell: (d) => (
        <>
          <Link href={`/ui/runs?dataset=${encodeURIComponent(d.id)}`} class="button">
            Train<span class="visually-hidden">{` on ${d.name}`}</span>
          </Link>
          <button type="button" class="danger" onClick={() => deleteDataset(d)}>
            Delete<span class="visually-hidden">{` ${d.name}`}</span>
          </button>
        </>
      ),
    },
  ];

  return (
    <div class="page">
      <h1>Datasets</h1>
      <form class="card inline-form" onSubmit={submit} aria-labelledby="new-dataset">
        <h2 id="new-dataset">New dataset</h2>
        <Field label="Dataset name">
          <input required maxLength={256} value={name} onInput={(e) => setName(e.currentTarget.value)} />
        </Field>
        <button type="submit" class="primary" disabled={create.busy}>
          Create dataset
        </button>
        <ErrorNote message={create.error} />
      </form>
      <ErrorNote message={datasets.error ?? remove.error} />
      <Table
        label="Datasets"
        columns={columns}
        rows={datasets.data}
        rowKey={(d) => d.id}
        loading={datasets.error ? undefined : "datasets"}
        empty="No datasets yet. Create one above, then upload files of input/output pairs."
      />
    </div>
  );
}
