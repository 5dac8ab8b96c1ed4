"""Schemathesis hooks for bench/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

`positive_data_acceptance` expects every request the document allows to be accepted. Conduit refuses, with a
documented 400, four kinds of requests whose validity JSON Schema cannot state, because it depends on the
uploaded file's content or on the model the request names rather than on the request's shape:

- an upload whose file is not lines of IO pairs (schemathesis sends a PNG as the binary `file` part): code
  `invalid_file`, naming the line, as OpenAI's /v1/files refuses a file that is not JSONL;
- `max_tokens` beyond the named model's context: param `max_tokens`, with the token counts, as OpenAI answers;
- `tools` or tool messages for a model whose chat template has no tool support: a 400 by design (issue #11:
  "a clear 400, never silently ignored");
- a `tool_choice` naming a function that is not in `tools`: a reference across fields, which JSON Schema
  cannot state (the rules it can state, such as a forced call needing tools, are in the document).

- in an eval's graders (`graders[i]`) or OpenAI testing criteria (`testing_criteria[i]`): a regex `pattern` the
  server's regular expression engine refuses, a `json_schema` grader's schema Ajv cannot compile, two graders of
  one name, criteria that compare with different item fields (the document says they must not; JSON Schema cannot
  compare items of a list);
- an OpenAI eval run's items without the field its eval's criteria compare with, or without `input` when no
  `input_messages` template says how to prompt: what an item must hold depends on the eval, another resource;
- an eval run's results asked for a `model` the run did not score;
- a run whose `datasetID` and `datasetId` name different datasets (JSON Schema cannot compare two fields).

This check is `positive_data_acceptance` except for exactly those answers, recognised by their error code,
param and reason; the script runs it in place of the built-in one. Any other refusal of valid data still fails.
"""

import json
import os
import re
import urllib.request

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

# The server, its key and the model it serves (bench/schemathesis.sh sets them).
BASE_URL = os.environ.get("CONDUIT_FUZZ_URL", "")
KEY = os.environ.get("CONDUIT_FUZZ_KEY", "")
MODEL = os.environ.get("CONDUIT_FUZZ_MODEL", "tiny")


def _model_or_content_refusal(response) -> bool:
    if response.status_code != 400:
        return False
    try:
        error = response.json()["error"]
    except Exception:
        return False
    code, param, message = error.get("code"), error.get("param"), error.get("message") or ""
    if code == "invalid_file" and param == "file":
        return True
    if code == "invalid_request" and param == "max_tokens" and "this model's context holds" in message:
        return True
    if code == "invalid_request" and param == "tool_choice" and "which is not in \"tools\"" in message:
        return True
    # A pattern RE2 refuses (its message says which syntax), a schema Ajv cannot compile.
    if code == "invalid_request" and re.fullmatch(r"(graders|testing_criteria)\[\d+\]\.pattern", param or ""):
        return True
    if code == "invalid_request" and re.fullmatch(r"(graders|testing_criteria)\[\d+\]\.schema", param or ""):
        return "is not a JSON Schema" in message
    if code == "invalid_request" and re.fullmatch(r"(graders|testing_criteria)\[\d+\]\.name", param or ""):
        return "two graders are named" in message
    if code == "invalid_request" and re.fullmatch(r"testing_criteria\[\d+\]\.reference", param or ""):
        return "every criterion compares with the same field" in message
    if code == "invalid_request" and (param or "").startswith("data_source.source.content["):
        return "must be text" in message
    # A run's `datasetID` and `datasetId` may both be sent only when they name the same dataset.
    if code == "invalid_request" and param == "datasetId" and "name different datasets" in message:
        return True
    # `?model=` of an eval run's results must be one of the run's models.
    if code == "invalid_request" and param == "model" and "is not one of this run's" in message:
        return True
    return code == "invalid_request" and param in ("tools", "messages") and "without tool support" in message


@schemathesis.check
def positive_data_acceptance_by_shape(ctx, response, case):
    """Valid data is accepted, unless refused for its file's content or for the model it names (see above)."""
    if _model_or_content_refusal(response):
        return None
    return positive_data_acceptance(ctx, response, case)


@schemathesis.hook
def before_call(ctx, case, kwargs):
    """An upload to a dataset the stateful phase created (a real `ds_` id) sends a valid file of pairs, as JSON.

    The document's link from `POST /conduit/dataset` gives the upload such a body, but Schemathesis builds the
    request for the operation's first media type (multipart, with a PNG for `file`); a dataset without pairs
    cannot start a run (409), so the links past it (a two-step run, every run operation) would never be reached.
    Uploads to ids the fuzzer made up are left as generated.
    """
    dataset = str((case.path_parameters or {}).get("dataset_id", ""))
    if case.operation.path == "/conduit/dataset/{dataset_id}/upload" and dataset.startswith("ds_"):
        case.media_type = "application/json"
        case.body = {"name": "pairs.jsonl", "ioPairs": [{"input": "ping", "output": "pong"}]}
        case.query = {}
    # A run of an eval the stateful phase created (a real `eval_` id) names the model the server serves, and items
    # of its own (the eval may have none): generated model names are never served (404), so no run would start.
    # Runs on ids the fuzzer made up are left as generated.
    evaluation = str((case.path_parameters or {}).get("eval_id", ""))
    if case.method.upper() == "POST" and evaluation.startswith("eval_"):
        if case.operation.path == "/conduit/evals/{eval_id}/runs":
            case.media_type = "application/json"
            case.body = {
                "models": [MODEL],
                "source": {"type": "items", "items": [{"input": "ping", "expected": "pong"}]},
                "maxTokens": 4,
            }
        elif case.operation.path == "/v1/evals/{eval_id}/runs":
            case.media_type = "application/json"
            case.body = {
                "data_source": {
                    "type": "completions",
                    "model": MODEL,
                    "source": {"type": "file_content", "content": [{"item": _item_for(evaluation)}]},
                    "sampling_params": {"max_completion_tokens": 4},
                }
            }


def _item_for(eval_id: str) -> dict:
    """An item holding every field the eval's testing criteria compare with (`{{item.a.b}}`), and an `input`."""
    item: dict = {"input": "ping"}
    try:
        request = urllib.request.Request(f"{BASE_URL}/v1/evals/{eval_id}", headers={"x-api-key": KEY})
        with urllib.request.urlopen(request, timeout=10) as response:
            criteria = json.load(response).get("testing_criteria", [])
    except Exception:
        return item
    for criterion in criteria:
        found = re.fullmatch(r"\{\{\s*item\.([A-Za-z0-9_.]+)\s*\}\}", str(criterion.get("reference", "")))
        if not found:
            continue
        *parents, last = found.group(1).split(".")
        at = item
        for key in parents:
            nested = at.get(key)
            if not isinstance(nested, dict):
                nested = at[key] = {}
            at = nested
        at[last] = "pong"
    return item
