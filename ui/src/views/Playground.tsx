import { useEffect, useRef, useState } from "preact/hooks";
import { samplingDefaults } from "../../../src/contract/sampling.ts";
import { api } from "../api.ts";
import { ErrorNote, Field } from "../components/common.tsx";
import { messageOf, useResource } from "../hooks.ts";

interface Turn {
  role: "user" | "assistant";
  content: string;
}

/** The Conduit API's sampling parameters (defaults in src/contract/sampling.ts). */
type Sampling = { -readonly [K in keyof typeof samplingDefaults]: number };

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
  for (const { key } of samplingFields) text[key] = String(samplingDefaults[key]);
  return text;
}

function samplingValues(text: SamplingText): Sampling {
  const values: Sampling = { ...samplingDefaults };
  for (const { key } of samplingFields) values[key] = Number(text[key]);
  return values;
}

/** Chat with a base model or a READY run, streaming the answer as it is generated. */
export function Playground({ model: initialModel }: { model: string | null }) {
  const options = useResource(async () => {
    const [models, runs] = await Promise.all([api.listModels(), api.listRuns({ limit: 1000 })]);
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
  /** Compare mode: the second model (one prompt, both models side by side); `null` when off. */
  const [compareWith, setCompareWith] = useState<string | null>(null);
  const [comparison, setComparison] = useState<{
    prompt: string;
    models: [string, string];
    answers: [string, string];
  }>();
  const transcript = useRef<HTMLDivElement>(null);

  const firstModel = options.data?.[0]?.id;
  useEffect(() => {
    if (!model && firstModel) setModel(firstModel);
  }, [firstModel]);
  useEffect(() => {
    const element = transcript.current;
    if (element) element.scrollTop = element.scrollHeight;
  }, [turns]);

  /** One prompt to both models at once, each answer streamed into its own column. */
  const sendBoth = async (text: string, second: string) => {
    const abort = new AbortController();
    setController(abort);
    setError(undefined);
    setPrompt("");
    const models: [string, string] = [model, second];
    setComparison({ prompt: text, models, answers: ["", ""] });
    const body = {
      prompt: text,
      ...(systemPrompt ? { system_prompt: systemPrompt } : {}),
      ...samplingValues(sampling),
    };
    try {
      await Promise.all(
        models.map(async (name, side) => {
          for await (const delta of api.chatStream({ ...body, model: name }, abort.signal))
            setComparison((c) => {
              if (!c) return c;
              const answers: [string, string] = [...c.answers];
              answers[side] += delta;
              return { ...c, answers };
            });
        }),
      );
    } catch (e) {
      if (!abort.signal.aborted) setError(messageOf(e));
    } finally {
      setController(undefined);
    }
  };

  const send = async () => {
    const text = prompt.trim();
    if (!text || controller || !model) return;
    if (compareWith !== null) {
      if (compareWith) await sendBoth(text, compareWith);
      return;
    }
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
      for await (const delta of api.chatStream(body, abort.signal)) append(delta);
    } catch (e) {
      if (!abort.signal.aborted) setError(messageOf(e));
    } finally {
      setController(undefined);
    }
  };

  const kinds = [
    { kind: "base", label: "Base models" },
    { kind: "fine-tuned", label: "Fine-tuned runs" },
    { kind: "adapter", label: "Imported adapters" },
  ] as const;
  const modelGroups = kinds.map(({ kind, label }) => {
    const models = (options.data ?? []).filter((m) => m.kind === kind);
    return models.length === 0 ? null : (
      <optgroup key={kind} label={label}>
        {models.map((m) => (
          <option key={m.id} value={m.id}>
            {m.label}
          </option>
        ))}
      </optgroup>
    );
  });
  return (
    <div class="page playground">
      <h1>Playground</h1>
      <ErrorNote message={options.error} />
      <div class="playground-layout">
        <section class="card settings" aria-labelledby="settings-heading">
          <h2 id="settings-heading">Model and sampling</h2>
          <Field label="Model" hint="Base models, and your READY runs.">
            <select value={model} onChange={(e) => setModel(e.currentTarget.value)}>
              {options.data === undefined ? (
                <option value={model}>{model || "Loading models…"}</option>
              ) : null}
              {modelGroups}
            </select>
          </Field>
          <Field label="Compare with a second model" hint="One prompt, both answers side by side." check>
            <input
              type="checkbox"
              checked={compareWith !== null}
              onChange={(e) => {
                const on = e.currentTarget.checked;
                setCompareWith(on ? (options.data?.find((m) => m.id !== model)?.id ?? "") : null);
                if (!on) setComparison(undefined);
              }}
            />
          </Field>
          {compareWith !== null ? (
            <Field label="Second model">
              <select value={compareWith} onChange={(e) => setCompareWith(e.currentTarget.value)}>
                {modelGroups}
              </select>
            </Field>
          ) : null}
          <Field label="System prompt" hint="Optional.">
            <textarea rows={3} value={systemPrompt} onInput={(e) => setSystemPrompt(e.currentTarget.value)} />
          </Field>
          <div class="grid compact">
            {samplingFields.map((f) => (
              <Field key={f.key} label={f.label} hint={`Default ${samplingDefaults[f.key]}.`}>
                <input
                  type="number"
                  name={f.key}
                  min={f.min}
                  max={f.max}
                  step={f.step}
                  required
                  value={sampling[f.key]}
                  onInput={(e) => {
                    const value = e.currentTarget.value;
                    setSampling((s) => ({ ...s, [f.key]: value }));
                  }}
                />
              </Field>
            ))}
          </div>
          <button type="button" onClick={() => setSampling(samplingText())}>
            Reset to defaults
          </button>
        </section>
        <section class="card chat" aria-labelledby="chat-heading">
          <h2 id="chat-heading">{compareWith !== null ? "Comparison" : "Conversation"}</h2>
          {compareWith !== null ? (
            <div class="comparison" role="region" aria-label="Comparison" aria-live="polite">
              {comparison ? (
                <>
                  <p class="turn turn-user">
                    <span class="role">You</span> {comparison.prompt}
                  </p>
                  <div class="compare-columns">
                    {comparison.models.map((name, side) => (
                      <section key={side} class="compare-column" aria-label={`Answer of ${name}`}>
                        <h3>{name}</h3>
                        <p>{comparison.answers[side] || (controller ? "…" : "")}</p>
                      </section>
                    ))}
                  </div>
                </>
              ) : (
                <p class="muted">Send a message: both models answer it.</p>
              )}
            </div>
          ) : (
            <div
              class="transcript"
              ref={transcript}
              role="log"
              aria-live="polite"
              tabIndex={0}
              aria-label="Conversation"
            >
              {turns.length === 0 ? (
                <p class="muted">Send a message to start.</p>
              ) : (
                turns.map((t, i) => (
                  <div key={i} class={`turn turn-${t.role}`}>
                    <span class="role">{t.role === "user" ? "You" : "Model"}</span>
                    <p>{t.content || (controller && i === turns.length - 1 ? "…" : "")}</p>
                  </div>
                ))
              )}
            </div>
          )}
          <ErrorNote message={error} />
          <form
            class="composer"
            onSubmit={(e) => {
              e.preventDefault();
              void send();
            }}
          >
            <Field label="Message" hint="Enter sends, Shift+Enter starts a new line." wide>
              <textarea
                rows={3}
                value={prompt}
                onInput={(e) => setPrompt(e.currentTarget.value)}
                onKeyDown={(e) => {
                  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
                    e.preventDefault();
                    void send();
                  }
                }}
              />
            </Field>
            <div class="toolbar">
              <button type="submit" class="primary" disabled={!!controller || !prompt.trim() || !model}>
                Send
              </button>
              {controller ? (
                <button type="button" onClick={() => controller.abort()}>
                  Stop
                </button>
              ) : null}
              <button
                type="button"
                onClick={() => {
                  setTurns([]);
                  setComparison(undefined);
                }}
                disabled={!!controller || (turns.length === 0 && !comparison)}
              >
                Clear conversation
              </button>
            </div>
          </form>
        </section>
      </div>
    </div>
  );
}
