/** Eight preference examples in OpenAI's DPO shape, one JSON line each: the preferred answer is kind, the other curt. */
export const preferenceLines = Array.from({ length: 8 }, (_, i) =>
  JSON.stringify({
    input: { messages: [{ role: "user", content: `Tell me about the cat number ${i}.` }] },
    preferred_output: [{ role: "assistant", content: `The cat ${i} is happy and likes to play.` }],
    non_preferred_output: [{ role: "assistant", content: "No." }],
  }),
);
