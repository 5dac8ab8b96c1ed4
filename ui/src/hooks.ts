import { useCallback, useEffect, useRef, useState } from "preact/hooks";

export interface Resource<T> {
  data: T | undefined;
  error: string | undefined;
  loading: boolean;
  reload: () => void;
}

/** Loads `load()` when `deps` change; `reload()` loads again keeping the current data on screen. */
export function useResource<T>(load: () => Promise<T>, deps: unknown[]): Resource<T> {
  const [state, setState] = useState<{ data?: T; error?: string; loading: boolean }>({ loading: true });
  const [generation, setGeneration] = useState(0);
  const loadRef = useRef(load);
  loadRef.current = load;
  useEffect(() => {
    let current = true;
    setState((s) => ({ ...s, loading: true }));
    loadRef.current().then(
      (data) => current && setState({ data, loading: false }),
      (error: unknown) => current && setState((s) => ({ ...s, error: messageOf(error), loading: false })),
    );
    return () => {
      current = false;
    };
  }, [...deps, generation]);
  const reload = useCallback(() => setGeneration((g) => g + 1), []);
  return { data: state.data, error: state.error, loading: state.loading, reload };
}

/** Calls `tick` every `ms` while `active`. */
export function useInterval(tick: () => void, ms: number, active: boolean): void {
  const tickRef = useRef(tick);
  tickRef.current = tick;
  useEffect(() => {
    if (!active) return;
    const timer = setInterval(() => tickRef.current(), ms);
    return () => clearInterval(timer);
  }, [ms, active]);
}

/**
 * An action started by a button: `busy` while it runs, `error` in plain words if it failed.
 * Returns what the action returned, or undefined when it failed.
 */
export function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string>();
  const run = useCallback(async <T>(action: () => Promise<T>): Promise<T | undefined> => {
    setBusy(true);
    setError(undefined);
    try {
      return await action();
    } catch (e) {
      setError(messageOf(e));
      return undefined;
    } finally {
      setBusy(false);
    }
  }, []);
  return { busy, error, setError, run };
}

export function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
