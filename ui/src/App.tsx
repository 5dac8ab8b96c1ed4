import { useEffect, useRef, useState } from "preact/hooks";
import { apiKey, onAuthChange, signOut } from "./auth.ts";
import { Link, useRoute, type Route } from "./router.tsx";
import { DatasetPage } from "./views/DatasetPage.tsx";
import { Datasets } from "./views/Datasets.tsx";
import { EvalPage } from "./views/EvalPage.tsx";
import { Evals } from "./views/Evals.tsx";
import { Playground } from "./views/Playground.tsx";
import { RunPage } from "./views/RunPage.tsx";
import { Runs } from "./views/Runs.tsx";
import { SignIn } from "./views/SignIn.tsx";

const titles: Record<Route["page"], string> = {
  datasets: "Datasets",
  dataset: "Dataset",
  runs: "Runs",
  run: "Run",
  playground: "Playground",
  evals: "Evals",
  eval: "Eval",
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

  if (!key) return <SignIn />;
  const section =
    route.page === "dataset"
      ? "datasets"
      : route.page === "run"
        ? "runs"
        : route.page === "eval"
          ? "evals"
          : route.page;
  const nav = (href: string, page: string, label: string) => (
    <li>
      <Link href={href} current={section === page}>
        {label}
      </Link>
    </li>
  );
  return (
    <div class="shell">
      <a href="#main" class="skip-link">
        Skip to content
      </a>
      <header class="topbar">
        <Link href="/ui/datasets" class="brand">
          Conduit
        </Link>
        <nav aria-label="Main">
          <ul>
            {nav("/ui/datasets", "datasets", "Datasets")}
            {nav("/ui/runs", "runs", "Runs")}
            {nav("/ui/evals", "evals", "Evals")}
            {nav("/ui/playground", "playground", "Playground")}
          </ul>
        </nav>
        <button type="button" class="signout" onClick={() => signOut()}>
          Sign out
        </button>
      </header>
      <main id="main" tabIndex={-1} ref={main}>
        <Page route={route} />
      </main>
    </div>
  );
}

function Page({ route }: { route: Route }) {
  switch (route.page) {
    case "datasets":
      return <Datasets />;
    case "dataset":
      return <DatasetPage key={route.id} id={route.id} />;
    case "runs":
      return <Runs datasetId={route.datasetId} />;
    case "run":
      return <RunPage key={route.id} id={route.id} />;
    case "playground":
      return <Playground model={route.model} />;
    case "evals":
      return <Evals />;
    case "eval":
      return <EvalPage key={route.id} id={route.id} runId={route.runId} />;
    case "not-found":
      return (
        <div class="page">
          <h1>Page not found</h1>
          <p>
            <Link href="/ui/datasets">Go to your datasets</Link>
          </p>
        </div>
      );
  }
}
