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

This check is `positive_data_acceptance` except for exactly those answers, recognised by their error code,
param and reason; the script runs it in place of the built-in one. Any other refusal of valid data still fails.
"""

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance


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
