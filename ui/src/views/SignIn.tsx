import { useState } from "preact/hooks";
import { checkKey } from "../api.ts";
import { signIn, signOutReason } from "../auth.ts";
import { ErrorNote } from "../components/common.tsx";
import { useAction } from "../hooks.ts";

/** Asks for an API key, checks it against the server, and keeps it in this browser. */
export function SignIn() {
  const [key, setKey] = useState("");
  const action = useAction();
  const submit = async (event: Event) => {
    event.preventDefault();
    const trimmed = key.trim();
    const accepted = await action.run(async () => {
      await checkKey(trimmed);
      return true;
    });
    if (accepted) signIn(trimmed);
  };
  return (
    <main class="signin" id="main">
      <h1>Conduit</h1>
      <p>Sign in with an API key to manage datasets, fine-tuning runs and models.</p>
      <form class="card" onSubmit={submit}>
        <label for="api-key">API key</label>
        <input
          id="api-key"
          type="password"
          autoComplete="current-password"
          required
          value={key}
          onInput={(e) => setKey(e.currentTarget.value)}
        />
        <p class="hint">
          Create one with <code>npx conduit keys create --user &lt;name&gt;</code>. It is stored in this
          browser only.
        </p>
        <ErrorNote message={action.error ?? (action.busy ? undefined : signOutReason)} />
        <button type="submit" class="primary" disabled={action.busy}>
          {action.busy ? "Checking…" : "Sign in"}
        </button>
      </form>
    </main>
  );
}
