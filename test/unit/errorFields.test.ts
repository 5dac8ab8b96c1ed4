import assert from "node:assert/strict";
import { test } from "node:test";
import { conduitFields } from "../../src/api/conduit/errorFields.ts";
import { errorBody } from "../../src/api/errorHandler.ts";
import { openAiFields } from "../../src/api/openai/errorFields.ts";
import { ConduitError, domainFields, inFaceNames } from "../../src/errors.ts";

test("each face names every domain field the services blame, and nothing else", () => {
  for (const [face, names] of Object.entries({ conduit: conduitFields, openai: openAiFields })) {
    assert.deepEqual(Object.keys(names).sort(), [...domainFields].sort(), face);
    for (const field of domainFields)
      assert.match(names[field], /^[a-z_.]+$/, `${face}: ${field} is a wire name`);
  }
});

test("an error blaming a domain field is named in each face's words; others pass unchanged", () => {
  const missing = new ConduitError("not_found", "run ft_x not found", { param: "runId" });
  assert.equal(errorBody(missing, "/conduit/finetuning/ft_x").error.param, "finetune_id");
  assert.equal(errorBody(missing, "/v1/fine_tuning/jobs/ft_x").error.param, "fine_tuning_job_id");
  assert.equal(errorBody(missing).error.param, "finetune_id");
  const cap = new ConduitError("invalid_request", "too long", { param: "maxTokens", retryAfter: 3 });
  const named = inFaceNames(cap, openAiFields);
  assert.equal(named.param, "max_tokens");
  assert.equal(named.retryAfter, 3);
  assert.equal(named.message, "too long");
  const wire = new ConduitError("invalid_request", "bad", { param: "messages" });
  assert.equal(inFaceNames(wire, conduitFields), wire);
  const none = new ConduitError("invalid_request", "bad");
  assert.equal(errorBody(none, "/v1/chat/completions").error.param, null);
});
