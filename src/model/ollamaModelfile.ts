/**
 * An Ollama Modelfile for a fine-tune (`ollama create <name> -f Modelfile`): `FROM` the base model's GGUF (or the
 * merged model), `ADAPTER` the LoRA adapter when there is one, and the chat format the run was trained with as
 * Ollama's Go `TEMPLATE` and its `PARAMETER stop` strings.
 */

/** Ollama's templates and stop strings for the chat formats Conduit knows by name (`ChatTemplate.name`). */
const OLLAMA_FORMATS: Record<string, { template: string; stop: string[] }> = {
  chatml: {
    template:
      "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n",
    stop: ["<|im_start|>", "<|im_end|>"],
  },
  llama3: {
    template:
      "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>" +
      "{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n",
    stop: ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
  },
  gemma: {
    template:
      '{{- range .Messages }}<start_of_turn>{{ if eq .Role "assistant" }}model{{ else }}user{{ end }}\n' +
      "{{ .Content }}<end_of_turn>\n{{ end }}<start_of_turn>model\n",
    stop: ["<start_of_turn>", "<end_of_turn>"],
  },
  phi3: {
    template: "{{- range .Messages }}<|{{ .Role }}|>\n{{ .Content }}<|end|>\n{{ end }}<|assistant|>\n",
    stop: ["<|end|>", "<|user|>", "<|assistant|>"],
  },
  mistral: {
    template:
      '{{- range .Messages }}{{ if eq .Role "user" }}[INST] {{ .Content }}[/INST]' +
      '{{ else if eq .Role "assistant" }}{{ .Content }}</s>{{ end }}{{ end }}',
    stop: ["[INST]", "[/INST]"],
  },
};

export interface ModelfileInput {
  /** What `FROM` names: a GGUF file beside the Modelfile (`./base.gguf`) or a model Ollama has. */
  from: string;
  /** The LoRA adapter's GGUF file beside the Modelfile; none for a merged or full model. */
  adapter?: string | undefined;
  /** The chat template the model's chats are rendered with (`chat_template` of the models list); `null` when unknown. */
  chatTemplate: { source: string; name: string } | null;
  /** Comment lines at the top. */
  comments?: readonly string[];
}

/** A JSON string is a valid Modelfile quoted string (Ollama unquotes with Go's rules). */
const quote = (text: string) => JSON.stringify(text);

/**
 * The Modelfile's text. A template Conduit knows by name (`chatml`, `llama3`, `gemma`, `phi3`, `mistral`, and the
 * plain ChatML of the `fallback`) is written as Ollama's; an `embedded` `custom` one is left to Ollama, which
 * reads the GGUF's own `tokenizer.chat_template`.
 */
export function ollamaModelfile(input: ModelfileInput): string {
  const lines = (input.comments ?? []).map((c) => `# ${c}`);
  lines.push(`FROM ${input.from}`);
  if (input.adapter !== undefined) lines.push(`ADAPTER ${input.adapter}`);
  const name = input.chatTemplate?.source === "fallback" ? "chatml" : input.chatTemplate?.name;
  const format = name === undefined ? undefined : OLLAMA_FORMATS[name];
  if (format) {
    lines.push(`TEMPLATE """${format.template}"""`);
    for (const stop of format.stop) lines.push(`PARAMETER stop ${quote(stop)}`);
  } else
    lines.push(
      `# No TEMPLATE: the chat template is ${input.chatTemplate ? `the model's own (${input.chatTemplate.name})` : "unknown"}; ` +
        "Ollama takes the one embedded in the GGUF.",
    );
  return `${lines.join("\n")}\n`;
}
