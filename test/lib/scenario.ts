import assert from "node:assert/strict";
import type { TestContext } from "node:test";
import type { FastifyInstance, InjectOptions } from "fastify";
import { KEY_A } from "./helper.ts";

/**
 * One request and what it must answer, as a row of a table of API cases (PocketBase's `ApiScenario`):
 * `runScenarios` sends each through `app.inject` and checks the status and the body.
 */
export interface ApiScenario {
  /** The case's name in the test report. Defaults to the method, the URL and the body. */
  name?: string;
  method: "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE";
  url: string;
  /** The API key, sent as `x-api-key`; `null` sends none. Defaults to `KEY_A` (alice). */
  key?: string | null;
  /** Headers besides the key's. Defaults to none. */
  headers?: Record<string, string>;
  /** The body: an object or array is sent as JSON, a string as it is. Defaults to none. */
  body?: unknown;
  /** The status the answer must have. */
  status: number;
  /** Fragments the answer's body must contain. Defaults to none. */
  contains?: (string | RegExp)[];
  /** Fragments it must not contain. Defaults to none. */
  absent?: (string | RegExp)[];
  /** The error the answer must carry: its `code`, and its `param` (`null`: none). Defaults to no check. */
  error?: { code?: string; param?: string | null };
}

function label(scenario: ApiScenario): string {
  if (scenario.name) return scenario.name;
  const body = scenario.body === undefined ? "" : ` ${JSON.stringify(scenario.body)}`.slice(0, 120);
  return `${scenario.method} ${scenario.url}${body} → ${scenario.status}`;
}

/** Sends one scenario's request and checks its answer; returns the answer for further checks. */
export async function checkScenario(app: FastifyInstance, scenario: ApiScenario) {
  const key = scenario.key === undefined ? KEY_A : scenario.key;
  const response = await app.inject({
    method: scenario.method,
    url: scenario.url,
    headers: { ...(key === null ? {} : { "x-api-key": key }), ...scenario.headers },
    ...(scenario.body === undefined ? {} : { payload: scenario.body as InjectOptions["payload"] }),
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
    const error = response.json<{ error?: { code?: string; param?: string | null } }>().error;
    assert.ok(error, `${what}\nis not an error`);
    if (scenario.error.code !== undefined) assert.equal(error.code, scenario.error.code, what);
    if (scenario.error.param !== undefined) assert.equal(error.param ?? null, scenario.error.param, what);
  }
  return response;
}

/** Runs a table of scenarios against one app, each as a subtest of `t` named after it. */
export async function runScenarios(t: TestContext, app: FastifyInstance, scenarios: ApiScenario[]) {
  for (const scenario of scenarios)
    await t.test(label(scenario), async () => {
      await checkScenario(app, scenario);
    });
}
