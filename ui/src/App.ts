import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { apiKey, onAuthChange, signOut } from "./auth.ts";
import { Link, useRoute, type Route } from "./router.ts";
import { DatasetPage } from "./views/DatasetPage.ts";
import { Datasets } from "./views/Datasets.ts";
import { Playground } from "./views/Playground.ts";
import { RunPage } from "./views/RunPage.ts";
import { Runs } from "./views/Runs.ts";
import { SignIn } from "./views/SignIn.ts";

const titles: Record<Route["page"], string> = {
  datasets: "Datasets",
  dataset: "Dataset",
  runs: "Runs",
  run: "Run",
  playground: "Playground",
  "not-found": "Not found",
};

/** The shell: sign-in gate, navigation, and the page of the current route. */
export function App() {
  const [key, setKey] = useState(apiKey);
  const route = useRoute();
  useEffect(() => onAuthChange(() => setKey(apiKey())), []);
  // After an in-app navigation, focus moves to the new page (as a page load would), not the old link.
  const main = useRef<HTMLElement>(null);
  const path = location.pathname + location.search;
  const previousPath = useRef(path);
  useEffect(() => {
    if (path !== previousPath.current) main.current?.focus();
    previousPath.current = path;
  }, [path]);
  useEffect(() => {
    document.title = key ? `${titles[route.page]} · Conduit` : "Sign in · Conduit";
  }, [key, route.page]);

  if (!key) return h(SignIn, null);
  const section = route.page === "dataset" ? "datasets" : route.page === "run" ? "runs" : route.page;
  const nav = (href: string, page: string, label: string) =>
    h("li", null, h(Link, { href, current: section === page }, label));
  return h(
    "div",
    { class: "shell" },
    h("a", { href: "#main", class: "skip-link" }, "Skip to content"),
    h(
      "header",
      { class: "topbar" },
      h(Link, { href: "/ui/datasets", class: "brand" }, "Conduit"),
      h(
        "nav",
        { "aria-label": "Main" },
        h(
          "ul",
          null,
          nav("/ui/datasets", "datasets", "Datasets"),
          nav("/ui/runs", "runs", "Runs"),
          nav("/ui/playground", "playground", "Playground"),
        ),
      ),
      h("button", { type: "button", class: "signout", onClick: () => signOut() }, "Sign out"),
    ),
    h("main", { id: "main", tabIndex: -1, ref: main }, h(Page, { route })),
  );
}

function Page({ route }: { route: Route }) {
  switch (route.page) {
    case "datasets":
      return h(Datasets, null);
    case "dataset":
      return h(DatasetPage, { key: route.id, id: route.id });
    case "runs":
      return h(Runs, { datasetId: route.datasetId });
    case "run":
      return h(RunPage, { key: route.id, id: route.id });
    case "playground":
      return h(Playground, { model: route.model });
    case "not-found":
      return h(
        "div",
        { class: "page" },
        h("h1", null, "Page not found"),
        h("p", null, h(Link, { href: "/ui/datasets" }, "Go to your datasets")),
      );
  }
}
