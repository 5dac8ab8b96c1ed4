import { h } from "preact";
import { useState } from "preact/hooks";
import { api } from "../api.ts";
import { ErrorNote, Field, Loading, TableScroll } from "../components/common.ts";
import { formatTime } from "../format.ts";
import { useAction, useResource } from "../hooks.ts";
import { Link, navigate } from "../router.ts";

/** Your datasets, and a form to create one (it opens the new dataset, ready for uploads). */
export function Datasets() {
  const datasets = useResource(() => api.datasets(), []);
  const [name, setName] = useState("");
  const create = useAction();
  const remove = useAction();

  const submit = async (event: Event) => {
    event.preventDefault();
    const dataset = await create.run(() => api.createDataset(name.trim()));
    if (dataset) navigate(`/ui/datasets/${encodeURIComponent(dataset.id)}`);
  };
  const deleteDataset = async (id: string, datasetName: string) => {
    if (!confirm(`Delete dataset "${datasetName}" and all its files?`)) return;
    await remove.run(() => api.deleteDataset(id));
    datasets.reload();
  };

  return h(
    "div",
    { class: "page" },
    h("h1", null, "Datasets"),
    h(
      "form",
      { class: "card inline-form", onSubmit: submit, "aria-labelledby": "new-dataset" },
      h("h2", { id: "new-dataset" }, "New dataset"),
      h(
        Field,
        { label: "Dataset name" },
        h("input", {
          required: true,
          maxLength: 256,
          value: name,
          onInput: (e: Event) => setName((e.currentTarget as HTMLInputElement).value),
        }),
      ),
      h("button", { type: "submit", class: "primary", disabled: create.busy }, "Create dataset"),
      h(ErrorNote, { message: create.error }),
    ),
    h(ErrorNote, { message: datasets.error ?? remove.error }),
    datasets.data === undefined
      ? datasets.error
        ? null
        : h(Loading, { what: "datasets" })
      : datasets.data.length === 0
        ? h(
            "p",
            { class: "muted" },
            "No datasets yet. Create one above, then upload files of input/output pairs.",
          )
        : h(
            TableScroll,
            { label: "Datasets" },
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
                  h("th", { scope: "col", class: "num" }, "IO pairs"),
                  h("th", { scope: "col" }, "Created"),
                  h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")),
                ),
              ),
              h(
                "tbody",
                null,
                datasets.data.map((d) =>
                  h(
                    "tr",
                    { key: d.id },
                    h(
                      "td",
                      { "data-label": "Name" },
                      h(Link, { href: `/ui/datasets/${encodeURIComponent(d.id)}` }, d.name),
                    ),
                    h("td", { class: "num", "data-label": "IO pairs" }, d.ioPairsCount),
                    h("td", { "data-label": "Created" }, formatTime(d.createdAt)),
                    h(
                      "td",
                      { class: "actions" },
                      h(
                        Link,
                        { href: `/ui/runs?dataset=${encodeURIComponent(d.id)}`, class: "button" },
                        "Train",
                        h("span", { class: "visually-hidden" }, ` on ${d.name}`),
                      ),
                      h(
                        "button",
                        { type: "button", class: "danger", onClick: () => deleteDataset(d.id, d.name) },
                        "Delete",
                        h("span", { class: "visually-hidden" }, ` ${d.name}`),
                      ),
                    ),
                  ),
                ),
              ),
            ),
          ),
  );
}
