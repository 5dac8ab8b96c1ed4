import type { ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";

/** The dashboard lives under /ui; the server answers index.html for every page below it. */
export const base = "/ui";

export type Route =
  | { page: "datasets" }
  | { page: "dataset"; id: string }
  | { page: "runs"; datasetId: string | null }
  | { page: "run"; id: string }
  | { page: "playground"; model: string | null }
  | { page: "evals" }
  | { page: "eval"; id: string; runId: string | null }
  | { page: "not-found" };

export function parseRoute(location: Location): Route {
  const path = location.pathname.startsWith(base) ? location.pathname.slice(base.length) : location.pathname;
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const query = new URLSearchParams(location.search);
  const [first, second, ...rest] = parts;
  if (rest.length > 0) return { page: "not-found" };
  if (first === undefined || (first === "datasets" && second === undefined)) return { page: "datasets" };
  if (first === "datasets" && second !== undefined) return { page: "dataset", id: second };
  if (first === "runs" && second === undefined) return { page: "runs", datasetId: query.get("dataset") };
  if (first === "runs" && second !== undefined) return { page: "run", id: second };
  if (first === "evals" && second === undefined) return { page: "evals" };
  if (first === "evals" && second !== undefined) return { page: "eval", id: second, runId: query.get("run") };
  if (first === "playground" && second === undefined)
    return { page: "playground", model: query.get("model") };
  return { page: "not-found" };
}

export function navigate(to: string): void {
  history.pushState(null, "", to);
  dispatchEvent(new PopStateEvent("popstate"));
}

/** The current route; follows links, navigate() and the back button. */
export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseRoute(location));
  useEffect(() => {
    const update = () => setRoute(parseRoute(location));
    addEventListener("popstate", update);
    return () => removeEventListener("popstate", update);
  }, []);
  return route;
}

/** A real link (so open-in-new-tab works) that changes page without reloading. */
export function Link(props: {
  href: string;
  class?: string;
  children?: ComponentChildren;
  current?: boolean;
}) {
  const follow = (event: MouseEvent) => {
    if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    event.preventDefault();
    navigate(props.href);
  };
  return (
    <a
      href={props.href}
      class={props.class}
      aria-current={props.current ? "page" : undefined}
      onClick={follow}
    >
      {props.children}
    </a>
  );
}
