/** The Conduit API's sampling defaults (API document, part 8), for the generation schemas and their clients (CLI, dashboard). */
export const samplingDefaults = {
  max_tokens: 256,
  temperature: 1,
  top_k: 50,
  top_p: 0.9,
  presence_penalty: 1,
  frequency_penalty: 1,
} as const;
