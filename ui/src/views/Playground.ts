import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { api, defaultSampling, type Sampling } from "../api.ts";
import { ErrorNote, Field } from "../components/common.ts";
import { messageOf, useResource } from "../hooks.ts";

interface Turn {
  role: "user" | "assistant";
  content: string;
}

/** Limits of each sampling parameter (the API's), with a label. */
const samplingFields: { key: keyof Sampling; label: string; min: number; max?: number; step: string }[] = [
  { key: "max_tokens", label: "Max tokens", min: 1, step: "1" },
  { key: "temperature", label: "Temperature", min: 0, max: 2, step: "0.05" },
  { key: "top_k", label: "Top k", min: 0, step: "1" },
  { key: "top_p", label: "Top p", min: 0.01, max: 1, step: "0.01" },
  { key: "presence_penalty", label: "Presence penalty", min: -2, max: 2, step: "0.1" },
  { key: "frequency_penalty", label: "Frequency penalty", min: -2, max: 2, step: "0.1" },
];

type SamplingText = Record<keyof Sampling, string>;

/** The form holds the parameters as text, starting from the defaults. */
function samplingText(): SamplingText {
  const text = {} as SamplingText;
  for (const { key } of samplingFields) text[key] = String(defaultSampling[key]);
  return text;
}

function samplingValues(text: SamplingText): Sampling {
  const values = { ...defaultSampling };
  for (const { key } of samplingFields) values[key] = Number(text[key]);
  return values;
}

/** Chat with a base model or a READY run, streaming the answer as it is generated. */
export function Playground({ model: initialModel }: { model: string | null }) {
  const options = useResource(async () => {
    const [models, runs] = await Promise.all([api.models(), api.runs()]);
    const runNames = new Map(runs.map((r) => [r.id, r.name]));
    return models.map((m) => ({
      id: m.id,
      label: m.kind === "fine-tuned" ? `${runNames.get(m.id) ?? m.id} (${m.id})` : m.id,
      kind: m.kind,
    }));
  }, []);
  const [model, setModel] = useState(initialModel ?? "");
  const [systemPrompt, setSystemPrompt] = useState("");
  const [sampling, setSampling] = useState(samplingText);
  const [turns, setTurns] = useState<Turn[]>([]);
  const [prompt, setPrompt] = useState("");
  const [error, setError] = useState<string>();
  const [controller, setController] = useState<AbortController>();
  const transcript = useRef<HTMLDivElement>(null);

  const firstModel = options.data?.[0]?.id;
  useEffect(() => {
    if (!model && firstModel) setModel(firstModel);
  }, [firstModel]);
  useEffect(() => {
    const element = transcript.current;
    if (element) element.scrollTop = element.scrollHeight;
  }, [turns]);

  const send = async () => {
    const text = prompt.trim();
    if (!text || controller || !model) return;
    // Turns always come in user/assistant pairs (an answer cut short keeps its place), as `history` needs.
    const history = turns.map((t) => t.content);
    const abort = new AbortController();
    setController(abort);
    setError(undefined);
    setPrompt("");
    setTurns((previous) => [
      ...previous,
      { role: "user", content: text },
      { role: "assistant", content: "" },
    ]);
    const append = (delta: string) =>
      setTurns((previous) => {
        const last = previous.at(-1);
        return last ? [...previous.slice(0, -1), { ...last, content: last.content + delta }] : previous;
      });
    try {
      const body = {
        model,
        prompt: text,
        history,
        ...(systemPrompt ? { system_prompt: systemPrompt } : {}),
        ...samplingValues(sampling),
      };
      for await (const event of api.chat(body, abort.signal)) {
        if (event.data === "[DONE]") break;
        const chunk = JSON.parse(event.data) as {
          error?: { message: string };
          choices?: { delta?: { content?: string } }[];
        };
        if (chunk.error) throw new Error(chunk.error.message);
        const delta = chunk.choices?.[0]?.delta?.content;
        if (delta) append(delta);
      }
    } catch (e) {
      if (!abort.signal.aborted) setError(messageOf(e));
    } finally {
      setController(undefined);
    }
  };

  return h(
    "div",
    { class: "page playground" },
    h("h1", null, "Playground"),
    h(ErrorNote, { message: options.error }),
    h(
      "div",
      { class: "playground-layout" },
      h(
        "section",
        { class: "card settings", "aria-labelledby": "settings-heading" },
        h("h2", { id: "settings-heading" }, "Model and sampling"),
        h(
          Field,
          { label: "Model", hint: "Base models, and your READY runs." },
          h(
            "select",
            { value: model, onChange: (e: Event) => setModel((e.currentTarget as HTMLSelectElement).value) },
            options.data === undefined ? h("option", { value: model }, model || "Loading models…") : null,
            (["base", "fine-tuned"] as const).map((kind) => {
              const models = (options.data ?? []).filter((m) => m.kind === kind);
              return models.length === 0
                ? null
                : h(
                    "optgroup",
                    { key: kind, label: kind === "base" ? "Base models" : "Fine-tuned runs" },
                    models.map((m) => h("option", { key: m.id, value: m.id }, m.label)),
                  );
            }),
          ),
        ),
        h(
          Field,
          { label: "System prompt", hint: "Optional." },
          h("textarea", {
            rows: 3,
            value: systemPrompt,
            onInput: (e: Event) => setSystemPrompt((e.currentTarget as HTMLTextAreaElement).value),
          }),
        ),
        h(
          "div",
          { class: "grid compact" },
          samplingFields.map((f) =>
            h(
              Field,
              { key: f.key, label: f.label, hint: `Default ${defaultSampling[f.key]}.` },
              h("input", {
                type: "number",
                name: f.key,
                min: f.min,
                max: f.max,
                step: f.step,
                required: true,
                value: sampling[f.key],
                onInput: (e: Event) =>
                  setSampling((s) => ({ ...s, [f.key]: (e.currentTarget as HTMLInputElement).value })),
              }),
            ),
          ),
        ),
        h("button", { type: "button", onClick: () => setSampling(samplingText()) }, "Reset to defaults"),
      ),
      h(
        "section",
        { class: "card chat", "aria-labelledby": "chat-heading" },
        h("h2", { id: "chat-heading" }, "Conversation"),
        h(
          "div",
          {
            class: "transcript",
            ref: transcript,
            role: "log",
            "aria-live": "polite",
            tabIndex: 0,
            "aria-label": "Conversation",
          },
          turns.length === 0
            ? h("p", { class: "muted" }, "Send a message to start.")
            : turns.map((t, i) =>
                h(
                  "div",
                  { key: i, class: `turn turn-${t.role}` },
                  h("span", { class: "role" }, t.role === "user" ? "You" : "Model"),
                  h("p", null, t.content || (controller && i === turns.length - 1 ? "…" : "")),
                ),
              ),
        ),
        h(ErrorNote, { message: error }),
        h(
          "form",
          {
            class: "composer",
            onSubmit: (e: Event) => {
              e.preventDefault();
              void send();
            },
          },
          h(
            Field,
            { label: "Message", hint: "Enter sends, Shift+Enter starts a new line.", wide: true },
            h("textarea", {
              rows: 3,
              value: prompt,
              onInput: (e: Event) => setPrompt((e.currentTarget as HTMLTextAreaElement).value),
              onKeyDown: (e: KeyboardEvent) => {
                if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
                  e.preventDefault();
                  void send();
                }
              },
            }),
          ),
          h(
            "div",
            { class: "toolbar" },
            h(
              "button",
              { type: "submit", class: "primary", disabled: !!controller || !prompt.trim() || !model },
              "Send",
            ),
            controller ? h("button", { type: "button", onClick: () => controller.abort() }, "Stop") : null,
            h(
              "button",
              { type: "button", onClick: () => setTurns([]), disabled: !!controller || turns.length === 0 },
              "Clear conversation",
            ),
          ),
        ),
      ),
    ),
  );
}
