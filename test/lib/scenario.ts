import assert from "node:assert/strict";
import type { TestContext } from "node:test";
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from "fastify";
import { KEY_A } from "./helper.ts";

/**
 * One request and what it must answer, as a row of a table of API cases (PocketBase's `ApiScenario`):
 * `runScenarios` runs each one's `setup`, sends its request through `app.inject`, checks the status and the body
 * and its own `check`, and runs its `teardown` whatever happened. What `setup` returns (`S`: the dataset or run the
 * case needs) reaches `url`, `body`, `check` and `teardown`.
 */
export interface ApiScenario<S = undefined> {
  /** The case's name in the test report. Defaults to the method, the URL and the body. */
  name?: string;
  /** Makes what the case needs before its request (a dataset, a run, a setting). Defaults to none. */
  setup?: (app: FastifyInstance) => S | Promise<S>;
  method: "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE";
  /** The URL, or a function of what `setup` made. */
  url: string | ((setup: S) => string);
  /** The API key, sent as `x-api-key`; `null` sends none. Defaults to `KEY_A` (alice). */
  key?: string | null;
  /** Headers besides the key's. Defaults to none. */
  headers?: Record<string, string>;
  /** The body: an object or array is sent as JSON, a string as it is; or a function of what `setup` made. Defaults to none. */
  body?: unknown;
  /** The status the answer must have. */
  status: number;
  /** Fragments the answer's body must contain. Defaults to none. */
  contains?: (string | RegExp)[];
  /** Fragments it must not contain. Defaults to none. */
  absent?: (string | RegExp)[];
  /**
   * The error the answer must carry: its `code`, its `param` (`null`: none) and what its message says. Defaults to
   * no check.
   */
  error?: { code?: string; param?: string | null; message?: RegExp };
  /** Further checks of the answer, or of what the request changed (nothing queued, a row written). Defaults to none. */
  check?: (response: LightMyRequestResponse, setup: S, app: FastifyInstance) => void | Promise<void>;
  /** Undoes what `setup` made, after the checks whether they passed or not. Defaults to none. */
  teardown?: (setup: S, app: FastifyInstance) => void | Promise<void>;
}

function label<S>(scenario: ApiScenario<S>): string {
  if (scenario.name) return scenario.name;
  const url = typeof scenario.url === "string" ? scenario.url : "(url after setup)";
  const shown = typeof scenario.body === "function" ? "(body after setup)" : scenario.body;
  const body = shown === undefined ? "" : ` ${JSON.stringify(shown)}`.slice(0, 120);
  return `${scenario.method} ${url}${body} → ${scenario.status}`;
}

/** Runs one scenario (setup, request, checks, teardown); returns the answer for further checks. */
export async function checkScenario<S>(app: FastifyInstance, scenario: ApiScenario<S>) {
  const setup = (await scenario.setup?.(app)) as S;
  try {
    const response = await send(app, scenario, setup);
    await scenario.check?.(response, setup, app);
    return response;
  } finally {
    await scenario.teardown?.(setup, app);
  }
}

async function send<S>(app: FastifyInstance, scenario: ApiScenario<S>, setup: S) {
  const key = scenario.key === undefined ? KEY_A : scenario.key;
  const body =
    typeof scenario.body === "function" ? (scenario.body as (s: S) => unknown)(setup) : scenario.body;
  const response = await app.inject({
    method: scenario.method,
    url: typeof scenario.url === "string" ? scenario.url : scenario.url(setup),
    headers: { ...(key === null ? {} : { "x-api-key": key }), ...scenario.headers },
    ...(body === undefined ? {} : { payload: body as InjectOptions["payload"] }),
  });
  const what = `${label(scenario)}: ${response.statusCode} ${response.body.slice(0, 2000)}`;
  assert.equal(response.statusCode, scenario.status, what);
  for (const fragment of scenario.contains ?? [])
    if (typeof fragment === "string")
      assert.ok(response.body.includes(fragment), `${what}\nlacks ${fragment}`);
    else assert.match(response.body, fragment, what);
  for (const fragment of scenario.absent ?? [])
    if (typeof fragment === "string")
      assert.ok(!response.body.includes(fragment), `${what}\nhas ${fragment}`);
    else assert.doesNotMatch(response.body, fragment, what);
  if (scenario.error) {
    const error = response.json<{ error?: { code?: string; param?: string | null; message?: string } }>()
      .error;
    assert.ok(error, `${what}\nis not an error`);
    if (scenario.error.code !== undefined) assert.equal(error.code, scenario.error.code, what);
    if (scenario.error.param !== undefined) assert.equal(error.param ?? null, scenario.error.param, what);
    if (scenario.error.message !== undefined) assert.match(error.message ?? "", scenario.error.message, what);
  }
  return response;
}

/** Runs a table of scenarios against one app, each as a subtest of `t` named after it. */
export async function runScenarios<S>(t: TestContext, app: FastifyInstance, scenarios: ApiScenario<S>[]) {
  for (const scenario of scenarios)
    await t.test(label(scenario), async () => {
      await checkScenario(app, scenario);
    });
}
