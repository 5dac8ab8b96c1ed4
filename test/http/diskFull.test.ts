import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { test } from "node:test";
import { sql } from "kysely";
import { BlobStore } from "../../src/store/BlobStore.ts";
import { asAlice, buildTestApp, createDataset, testEnv, as, KEY_A } from "../lib/helper.ts";

/** A blob store on a disk that has `free` bytes left: a write past them fails with ENOSPC. */
class FullDisk extends BlobStore {
  free = 0;

  protected override createTempStream(tempPath: string): Writable {
    const file = fs.openSync(tempPath, "wx");
    return new Writable({
      write: (chunk: Buffer, _encoding, callback) => {
        if (chunk.length > this.free) {
          const error = Object.assign(new Error(`ENOSPC: no space left on device, write`), {
            code: "ENOSPC",
            errno: -28,
            syscall: "write",
          });
          return callback(error);
        }
        this.free -= chunk.length;
        fs.writeSync(file, chunk);
        callback();
      },
      final: (callback) => callback(),
      destroy: (error, callback) => {
        fs.closeSync(file);
        callback(error);
      },
    });
  }
}

const boundary = "----conduit";
const jsonl = '{"input":"hi","output":"hello"}\n{"input":"bye","output":"goodbye"}\n';

/** Every way to upload the same file. */
function uploads(ds: string) {
  const url = `/conduit/dataset/${ds}/upload`;
  return [
    {
      url,
      headers: { "content-type": `multipart/form-data; boundary=${boundary}` },
      payload:
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n` +
        `${jsonl}\r\n--${boundary}--\r\n`,
    },
    { url: `${url}?name=a.jsonl`, headers: { "content-type": "application/jsonl" }, payload: jsonl },
    { url, headers: {}, payload: { name: "a.jsonl", content: jsonl } },
  ];
}

function assertOutOfSpace(response: { statusCode: number; body: string; json(): unknown }, label: string) {
  assert.equal(response.statusCode, 507, `${label} → ${response.statusCode} ${response.body}`);
  assert.deepEqual(response.json(), {
    error: {
      message: "the server's storage is full, so nothing was stored; retry once space has been freed",
      type: "server_error",
      param: null,
      code: "insufficient_storage",
    },
  });
}

test("a full disk fails uploads with 507 insufficient_storage and stores nothing", async (t) => {
  const env = await testEnv(t);
  const blobs = new FullDisk(path.join(env.dataDir, "blobs"));
  const { app } = await buildTestApp(t, env, { blobs });
  const ds = await createDataset(app, "d");
  const send = (upload: ReturnType<typeof uploads>[number]) =>
    app.inject({
      method: "POST",
      url: upload.url,
      headers: { ...asAlice, ...upload.headers },
      payload: upload.payload,
    });

  blobs.free = 10;
  for (const upload of uploads(ds.id)) {
    const response = await send(upload);
    assertOutOfSpace(response, `${upload.url} ${upload.headers["content-type"] ?? "json"}`);
  }
  const files = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`);
  assert.deepEqual(files.json(), []);
  const dataset = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}`);
  assert.equal(dataset.json().ioPairsCount, 0);
  assert.deepEqual(fs.readdirSync(path.join(env.dataDir, "blobs", ".tmp")), [], "no temp file is left");

  // Once there is room again, the same uploads work.
  blobs.free = Infinity;
  for (const upload of uploads(ds.id)) {
    const response = await send(upload);
    assert.equal(response.statusCode, 200, response.body);
  }
});

test("a full database fails writes with 507 insufficient_storage; reads go on", async (t) => {
  const { app, core } = await buildTestApp(t, await testEnv(t));
  const { kysely } = core.db;
  // SQLite refuses to grow the database past this many pages: SQLITE_FULL, as on a full disk.
  const pages = await sql<{ page_count: number }>`PRAGMA page_count`.execute(kysely);
  await sql.raw(`PRAGMA max_page_count = ${pages.rows[0]?.page_count ?? 0}`).execute(kysely);

  let created = 0;
  let full: Awaited<ReturnType<typeof app.inject>> | undefined;
  for (let i = 0; i < 1000 && !full; i++) {
    const response = await as(app, KEY_A).post("/conduit/dataset", {
      name: `dataset ${i} ${"x".repeat(200)}`,
    });
    if (response.statusCode === 200) created++;
    else full = response;
  }
  assert.ok(full, "the database filled up");
  assertOutOfSpace(full, "POST /conduit/dataset");
  const list = await as(app, KEY_A).get("/conduit/dataset?limit=1000");
  assert.equal(list.statusCode, 200);
  assert.equal(list.json().length, created, "the refused dataset was not stored");
});

test("healthz reports the data directory's free space, degraded below CONDUIT_MIN_FREE_BYTES", async (t) => {
  const roomy = await buildTestApp(t, await testEnv(t, "sqlite", { CONDUIT_MIN_FREE_BYTES: "0" }));
  const ok = (await roomy.app.inject({ url: "/healthz" })).json();
  assert.equal(ok.status, "ok");
  assert.equal(ok.warnings, undefined);
  assert.ok(ok.disk.freeBytes > 0 && ok.disk.freeBytes <= ok.disk.totalBytes, JSON.stringify(ok));
  assert.equal(ok.disk.minFreeBytes, 0);

  const tight = await buildTestApp(
    t,
    await testEnv(t, "sqlite", { CONDUIT_MIN_FREE_BYTES: String(Number.MAX_SAFE_INTEGER) }),
  );
  const response = await tight.app.inject({ url: "/healthz" });
  assert.equal(response.statusCode, 200, "degraded still answers: the service works");
  const degraded = response.json();
  assert.equal(degraded.status, "degraded");
  assert.match(degraded.warnings[0], /MiB free, less than CONDUIT_MIN_FREE_BYTES/);
});

/** A 4 MiB tmpfs, when this process may mount one (root); `undefined` otherwise. */
function smallTmpfs(t: { after(fn: () => unknown): void }): string | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-full-"));
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=4m", "tmpfs", dir], { stdio: "ignore" });
  } catch {
    fs.rmdirSync(dir);
    return undefined;
  }
  t.after(() => {
    execFileSync("umount", ["-l", dir], { stdio: "ignore" });
    fs.rmdirSync(dir);
  });
  return dir;
}

test("on a really full disk (a small tmpfs): 507, nothing half-stored, and it recovers", async (t) => {
  const env = await testEnv(t, "sqlite", { CONDUIT_MIN_FREE_BYTES: String(1024 * 1024) });
  const disk = smallTmpfs(t);
  if (!disk) return t.skip("mounting a tmpfs needs root; the injected ENOSPC test above covers the API");
  env.env.CONDUIT_DATA_DIR = disk;
  env.env.CONDUIT_MODELS_DIR = path.join(env.dataDir, "models");
  const { app } = await buildTestApp(t, env);
  const ds = await createDataset(app, "d");

  // Fill the disk, leaving less than one upload.
  const filler = path.join(disk, "filler");
  const fd = fs.openSync(filler, "w");
  try {
    const block = Buffer.alloc(64 * 1024, 1);
    for (;;) fs.writeSync(fd, block);
  } catch (error) {
    assert.equal((error as NodeJS.ErrnoException).code, "ENOSPC");
  } finally {
    fs.closeSync(fd);
  }
  const big = jsonl.repeat(2000);
  const refused = await app.inject({
    method: "POST",
    url: `/conduit/dataset/${ds.id}/upload?name=big.jsonl`,
    headers: { ...asAlice, "content-type": "application/jsonl" },
    payload: big,
  });
  assertOutOfSpace(refused, "raw upload on a full tmpfs");
  assert.deepEqual(fs.readdirSync(path.join(disk, "blobs", ".tmp")), []);
  const health = (await app.inject({ url: "/healthz" })).json();
  assert.equal(health.status, "degraded");
  assert.ok(health.disk.freeBytes < 1024 * 1024);

  fs.rmSync(filler);
  const accepted = await app.inject({
    method: "POST",
    url: `/conduit/dataset/${ds.id}/upload?name=big.jsonl`,
    headers: { ...asAlice, "content-type": "application/jsonl" },
    payload: big,
  });
  assert.equal(accepted.statusCode, 200, accepted.body);
  assert.equal(accepted.json().ioPairsCount, 4000);
  assert.equal((await app.inject({ url: "/healthz" })).json().status, "ok");
});
