/**
 * The weights a LoRA adapter can target, by their llama.cpp tensor names: `blk.N.<target>.weight` in the
 * blocks `complexity` selects, and `output` for the output head (`output.weight`; skipped when the model ties
 * it to the token embeddings, as SmolLM2 does, since llama.cpp has no adapter path for the embeddings).
 * Imported by the API schema, the run service and the trainer; imports nothing.
 *
 * `attn_k` and `attn_v` are left out on purpose: in the pinned llama.cpp release keys and values reach
 * attention through the KV cache (`set_rows`), which has no backward pass, so adapters on them would get
 * no gradient and never train.
 */
export const LORA_TARGETS = ["attn_q", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output"] as const;

export type LoraTarget = (typeof LORA_TARGETS)[number];

/** Weights that exist in llama.cpp models but cannot be trained by this release's backward pass. */
export const UNTRAINABLE_LORA_TARGETS = ["attn_k", "attn_v"] as const;
