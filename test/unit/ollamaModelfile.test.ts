import assert from "node:assert/strict";
import { test } from "node:test";
import { ollamaModelfile } from "../../src/model/ollamaModelfile.ts";

test("a Modelfile names the base and the adapter, with a known chat format as Ollama's TEMPLATE and stops", () => {
  const text = ollamaModelfile({
    from: "./base.gguf",
    adapter: "./ft_1-lora.gguf",
    chatTemplate: { source: "architecture", name: "llama3" },
    comments: ["Run ft_1"],
  });
  const lines = text.split("\n");
  assert.equal(lines[0], "# Run ft_1");
  assert.equal(lines[1], "FROM ./base.gguf");
  assert.equal(lines[2], "ADAPTER ./ft_1-lora.gguf");
  assert.match(text, /^TEMPLATE """\{\{- range \.Messages \}\}<\|start_header_id\|>/m);
  assert.deepEqual(
    lines.filter((l) => l.startsWith("PARAMETER stop")),
    [
      'PARAMETER stop "<|start_header_id|>"',
      'PARAMETER stop "<|end_header_id|>"',
      'PARAMETER stop "<|eot_id|>"',
    ],
  );
  assert.ok(text.endsWith("\n"));
});

test("the fallback ChatML becomes Ollama's ChatML; a merged model has no ADAPTER; an embedded template is left to Ollama", () => {
  const fallback = ollamaModelfile({
    from: "./m.gguf",
    chatTemplate: { source: "fallback", name: "chatml" },
  });
  assert.doesNotMatch(fallback, /^ADAPTER/m);
  assert.match(fallback, /<\|im_start\|>\{\{ \.Role \}\}/);
  assert.match(fallback, /^PARAMETER stop "<\|im_end\|>"$/m);
  const custom = ollamaModelfile({ from: "./m.gguf", chatTemplate: { source: "embedded", name: "custom" } });
  assert.doesNotMatch(custom, /^(TEMPLATE|PARAMETER)/m);
  assert.match(custom, /^# No TEMPLATE: the chat template is the model's own \(custom\)/m);
  assert.match(ollamaModelfile({ from: "x", chatTemplate: null }), /chat template is unknown/);
});
