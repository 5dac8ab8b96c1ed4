/**
 * How a trainer process's death by `signal` reads in a run's error. SIGBUS on these machines means a file the
 * process had mapped shrank under it: a base model rewritten or truncated in place (an operator's `cp` over it)
 * while llama.cpp converted it or the torch worker dequantized it.
 */
export function killedBy(signal: NodeJS.Signals): string {
  if (signal !== "SIGBUS") return `was killed by ${signal}`;
  return (
    "was killed by SIGBUS: a file it had mapped, most likely the base model, was truncated or rewritten in " +
    "place while it read it; put a new version of a model in place by renaming a complete file over it, " +
    "then start the run again"
  );
}
