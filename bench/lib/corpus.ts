/** Training text for the training benchmarks. */

/** Deterministic TinyStories-like paragraphs, `kib` KiB in all. */
export function corpus(kib: number): string[] {
  const names = ["Lily", "Tom", "Sam", "Mia", "Ben", "Anna", "Max", "Sue"];
  const things = ["a red ball", "a little dog", "a big tree", "a shiny box", "a blue kite", "a small cat"];
  const verbs = ["found", "saw", "liked", "wanted", "shared", "lost", "painted", "hugged"];
  const ends = ["They were very happy.", "It was a fun day.", "Mom smiled at them.", "Then they went home."];
  let state = 42;
  const pick = <T>(xs: T[]): T => {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    return xs[state % xs.length]!;
  };
  const paragraphs: string[] = [];
  let size = 0;
  while (size < kib * 1024) {
    let text = "";
    for (let i = 0; i < 4; i++) {
      const a = pick(names);
      const b = pick(names);
      text += `Once upon a time, ${a} ${pick(verbs)} ${pick(things)}. ${a} showed it to ${b}. ${b} said, "I like it!" ${pick(ends)} `;
    }
    paragraphs.push(text.trim());
    size += text.length + 2;
  }
  return paragraphs;
}
