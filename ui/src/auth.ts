/** The API key of the signed-in user, kept in localStorage so a reload stays signed in. */

const storageKey = "conduit.apiKey";
const listeners = new Set<() => void>();

export function apiKey(): string | null {
  return localStorage.getItem(storageKey);
}

export function signIn(key: string): void {
  localStorage.setItem(storageKey, key);
  notify();
}

/** Forgets the key. `reason` is shown on the sign-in form (e.g. the server refused the key). */
export function signOut(reason?: string): void {
  localStorage.removeItem(storageKey);
  signOutReason = reason;
  notify();
}

export let signOutReason: string | undefined;

export function onAuthChange(listener: () => void): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

// Signing in or out in another tab applies here too.
addEventListener("storage", (event) => {
  if (event.key === storageKey) notify();
});

function notify(): void {
  for (const listener of listeners) listener();
}
