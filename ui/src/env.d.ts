// The dashboard runs in browsers; the root tsconfig targets Node, so the DOM types come in here.
/// <reference lib="dom" />
/// <reference lib="dom.iterable" />
