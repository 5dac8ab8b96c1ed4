#!/usr/bin/env bash
# Fuzzes the whole API from its OpenAPI document with schemathesis (PyPI), every check, every phase
# (examples, coverage, fuzzing, stateful), against a real `conduit serve` on a temp data dir with the
# tiny generated model and one key. Prints schemathesis's report; exits with its status.
#
#   bash bench/schemathesis.sh [--max-examples 30] [any other `schemathesis run` option]
#
# The venv goes to .cache/schemathesis-venv (git-ignored), made once.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=bench/.cache/schemathesis-venv
if [ ! -x "$venv/bin/schemathesis" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet schemathesis
fi

data=$(mktemp -d /tmp/conduit-schemathesis-XXXXXX)
port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
key=schemathesis-key-0000000000
CONDUIT_DATA_DIR=$data node bin/conduit.js models create-tiny >/dev/null
# The fuzzer sends wrong keys on purpose, thousands of them: no failed-key throttle (CONDUIT_MAX_KEY_FAILURES=0).
CONDUIT_DATA_DIR=$data CONDUIT_PORT=$port CONDUIT_API_KEYS=$key:fuzzer CONDUIT_DEFAULT_MODEL=tiny CONDUIT_MAX_KEY_FAILURES=0 \
  CONDUIT_METRICS_USERS=fuzzer CONDUIT_LOG_LEVEL=warn node bin/conduit.js serve >"$data/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 1
done

# Every check, with the built-in positive_data_acceptance replaced by the one in bench/schemathesis_hooks.py,
# which differs only for refusals that depend on a file's content or on the named model (the file says which).
# The document's links lead the stateful phase from a new dataset to an upload, a two-step run on the tiny model
# and every run operation; the HAR of all requests is counted below.
har=bench/.cache/schemathesis-last.har
status=0
CONDUIT_FUZZ_URL="http://127.0.0.1:$port" CONDUIT_FUZZ_KEY=$key CONDUIT_FUZZ_MODEL=tiny \
  SCHEMATHESIS_HOOKS=bench/schemathesis_hooks.py "$venv/bin/schemathesis" --config-file bench/schemathesis.toml run "http://127.0.0.1:$port/openapi.json" \
  -H "x-api-key: $key" --checks all --exclude-checks positive_data_acceptance \
  --phases examples,coverage,fuzzing,stateful \
  --suppress-health-check all --report har --report-har-path "$har" "$@" || status=$?
python3 - "$har" <<'PY'
import json, re, sys
from collections import Counter
entries = json.load(open(sys.argv[1]))["log"]["entries"]
reached, ok = Counter(), Counter()
# Operations on a real run or eval run (an id the server made), by path pattern.
patterns = [
    (r"^/conduit/finetuning/ft_[0-9A-Z]{26}(/[a-z]+)?$", "/conduit/finetuning/{id}"),
    (r"^/v1/fine_tuning/jobs/ft_[0-9A-Z]{26}(/[a-z]+)?$", "/v1/fine_tuning/jobs/{id}"),
    (r"^/conduit/evals/eval_[0-9A-Z]{26}/runs/evalrun_[0-9A-Z]{26}(/[a-z]+)?$", "/conduit/evals/{id}/runs/{run}"),
    (r"^/v1/evals/eval_[0-9A-Z]{26}/runs/evalrun_[0-9A-Z]{26}(/[a-z_]+)?$", "/v1/evals/{id}/runs/{run}"),
]
created = Counter()
for e in entries:
    path = re.sub(r"^https?://[^/]+", "", e["request"]["url"]).split("?")[0]
    method, status = e["request"]["method"], e["response"]["status"]
    if method == "POST" and 200 <= status < 300 and re.match(r"^(/conduit|/v1)/evals/eval_[0-9A-Z]{26}/runs$", path):
        created[path.split("/")[1]] += 1
    for pattern, name in patterns:
        m = re.match(pattern, path)
        if not m:
            continue
        op = f"{method} {name}{m.group(1) or ''}"
        reached[op] += 1
        if 200 <= status < 300:
            ok[op] += 1
print(f"\neval runs created: {created['conduit']} (/conduit/evals), {created['v1']} (/v1/evals)")
print(f"requests to a run or eval-run operation with a real id: {sum(reached.values())} ({sum(ok.values())} answered 2xx)")
for op in sorted(reached):
    print(f"  {op}: {reached[op]} ({ok[op]} 2xx)")
PY
exit $status
