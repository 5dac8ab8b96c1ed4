import { api } from "../api.ts";
import { ErrorNote } from "../components/common.tsx";
import { Table } from "../components/Table.tsx";
import { formatTime } from "../format.ts";
import { useResource } from "../hooks.ts";
import { Link } from "../router.tsx";

/** Your evals, newest first: the automatic before/after of runs, and those made with the API or the CLI. */
export function Evals() {
  const evals = useResource(() => api.listEvals({ limit: 200 }), []);
  return (
    <div class="page">
      <h1>Evals</h1>
      <p class="muted">
        Base models and fine-tunes scored side by side on the same items. A run with held-out pairs gets one
        when it becomes READY; make others with <code>conduit evals run</code> or{" "}
        <code>POST /conduit/evals</code>.
      </p>
      <ErrorNote message={evals.error} />
      <Table
        label="Evals"
        rows={evals.data}
        rowKey={(e) => e.id}
        loading={evals.error ? undefined : "evals"}
        empty="No evals yet."
        columns={[
          {
            label: "Name",
            cell: (e) => <Link href={`/ui/evals/${encodeURIComponent(e.id)}`}>{e.name}</Link>,
          },
          { label: "Graders", cell: (e) => e.graders.map((g) => String(g.name)).join(", ") },
          {
            label: "Run",
            cell: (e) =>
              e.runId ? <Link href={`/ui/runs/${encodeURIComponent(e.runId)}`}>{e.runId}</Link> : "—",
          },
          { label: "Created", cell: (e) => formatTime(e.createdAt) },
        ]}
      />
    </div>
  );
}
