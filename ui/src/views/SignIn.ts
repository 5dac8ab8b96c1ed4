import { h } from "preact";
import { useState } from "preact/hooks";
import { checkKey } from "../api.ts";
import { signIn, signOutReason } from "../auth.ts";
import { ErrorNote } from "../components/common.ts";
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
  return h(
    "main",
    { class: "signin", id: "main" },
    h("h1", null, "Conduit"),
    h("p", null, "Sign in with an API key to manage datasets, fine-tuning runs and models."),
    h(
      "form",
      { class: "card", onSubmit: submit },
      h("label", { for: "api-key" }, "API key"),
      h("input", {
        id: "api-key",
        type: "password",
        autoComplete: "current-password",
        required: true,
        value: key,
        onInput: (e: Event) => setKey((e.currentTarget as HTMLInputElement).value),
      }),
      h(
        "p",
        { class: "hint" },
        "Create one with ",
        h("code", null, "npx conduit keys create --user <name>"),
        ". It is stored in this browser only.",
      ),
      h(ErrorNote, { message: action.error ?? (action.busy ? undefined : signOutReason) }),
      h(
        "button",
        { type: "submit", class: "primary", disabled: action.busy },
        action.busy ? "Checking…" : "Sign in",
      ),
    ),
  );
}
