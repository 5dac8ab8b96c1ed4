import { Type, type Static } from "@sinclair/typebox";
import { noControlCharacters } from "./patterns.ts";

/** Imported LoRA adapters: `POST/GET /conduit/models/adapters`, `GET/DELETE /conduit/models/adapters/{adapter_id}`. */

export const Adapter = Type.Object(
  {
    id: Type.String({ description: "The adapter's id (`ad_…`): what to pass as `model` to chat with it." }),
    name: Type.String({ description: "Its label: the `name` field of the import, or its id." }),
    base_model: Type.String({ description: "The models-directory model it applies to." }),
    format: Type.Union([Type.Literal("gguf"), Type.Literal("peft")], {
      description:
        "What was uploaded: a GGUF LoRA (kept as it is), or a PEFT adapter (converted to a GGUF LoRA).",
    }),
    rank: Type.Integer({ description: "The LoRA rank." }),
    alpha: Type.Number({
      description:
        "The LoRA alpha as llama.cpp applies it (`alpha / rank` scales the adapter; an rsLoRA adapter's `lora_alpha` × √rank).",
    }),
    weights: Type.Integer({ description: "Base weights it adapts." }),
    size_bytes: Type.Integer({ description: "Bytes of the stored GGUF adapter." }),
    created_at: Type.String({ description: "UTC time, `YYYY-MM-DD HH:MM:SS.mmm`" }),
  },
  { description: "A LoRA adapter imported for a base model." },
);
export type AdapterWire = Static<typeof Adapter>;

export const AdapterParams = Type.Object({
  adapter_id: Type.String({ minLength: 1, maxLength: 128, pattern: noControlCharacters }),
});

/** The multipart body of an import, for the API document (the handler reads the parts itself). */
export const ImportAdapterUpload = {
  content: {
    "multipart/form-data": {
      schema: Type.Object(
        {
          base_model: Type.String({ description: "The models-directory model the adapter was trained on." }),
          name: Type.Optional(Type.String({ description: "A label for listings (1 to 256 characters)." })),
          file: Type.Optional(
            Type.String({
              format: "binary",
              description:
                "A GGUF LoRA adapter (`general.type` `adapter`), as `llama-server --lora` takes it.",
            }),
          ),
          adapter_model: Type.Optional(
            Type.String({ format: "binary", description: "A PEFT adapter's `adapter_model.safetensors`." }),
          ),
          adapter_config: Type.Optional(
            Type.String({ format: "binary", description: "Its `adapter_config.json`." }),
          ),
        },
        { additionalProperties: false },
      ),
    },
  },
};
