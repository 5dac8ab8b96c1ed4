/** The config module's own rules: how settings parse, and what the start log may show. No server, no model. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { describeConfig, loadConfig, redactUrl } from "../../src/config.ts";

test("credentials in URLs never reach the start log, in any of their forms", () => {
  const cases: [string, string][] = [
    ["postgres://alice:s3cret@db:5432/conduit", "postgres://alice:***@db:5432/conduit"],
    ["postgres://alice@db:5432/conduit?password=s3cret", "postgres://alice@db:5432/conduit?password=***"],
    [
      "postgresql://db/conduit?user=alice&password=s3cret&sslmode=require",
      "postgresql://db/conduit?user=alice&password=***&sslmode=require",
    ],
    [
      "postgres://db/c?sslpassword=k3y&application_name=x",
      "postgres://db/c?sslpassword=***&application_name=x",
    ],
    ["https://tracker.example/?token=abc&x=1", "https://tracker.example/?token=***&x=1"],
    ["postgres://db/conduit", "postgres://db/conduit"],
    // Not a URL: the same forms are found by pattern.
    ["host=db user=alice password=s3cret dbname=c", "host=db user=alice password=*** dbname=c"],
  ];
  for (const [raw, shown] of cases) {
    assert.equal(redactUrl(raw), shown, raw);
    assert.doesNotMatch(redactUrl(raw), /s3cret|k3y|abc&/, raw);
  }
  const config = loadConfig({
    CONDUIT_DATA_DIR: "/tmp/x",
    DATABASE_URL: "postgres://alice:one@db/c?password=two",
    CONDUIT_API_KEYS: "secret-key-123:alice",
  });
  const logged = JSON.stringify(describeConfig(config));
  assert.doesNotMatch(logged, /one|two|secret-key-123/);
  assert.match(logged, /postgres:\/\/alice:\*\*\*@db\/c\?password=\*\*\*/);
});

test("a torch run on several machines needs where they meet, as host:port", () => {
  assert.equal(loadConfig({}).trainNodes, 1);
  assert.equal(loadConfig({}).trainRendezvous, undefined);
  assert.throws(
    () => loadConfig({ CONDUIT_TRAIN_NODES: "2" }),
    /CONDUIT_TRAIN_NODES above 1 needs CONDUIT_TRAIN_RENDEZVOUS/,
  );
  const two = loadConfig({ CONDUIT_TRAIN_NODES: "2", CONDUIT_TRAIN_RENDEZVOUS: "10.0.0.5:29500" });
  assert.deepEqual([two.trainNodes, two.trainRendezvous], [2, { host: "10.0.0.5", port: 29500 }]);
  assert.deepEqual(loadConfig({ CONDUIT_TRAIN_RENDEZVOUS: "[fd00::5]:29500" }).trainRendezvous, {
    host: "fd00::5",
    port: 29500,
  });
  for (const bad of ["10.0.0.5", "10.0.0.5:0", ":29500", "a b:1", "host:99999"])
    assert.throws(
      () => loadConfig({ CONDUIT_TRAIN_RENDEZVOUS: bad }),
      /CONDUIT_TRAIN_RENDEZVOUS must be host:port/,
      bad,
    );
  assert.throws(
    () => loadConfig({ CONDUIT_TRAIN_RANKS: "0" }),
    /CONDUIT_TRAIN_RANKS must be an integer between 1 and 64/,
  );
});
