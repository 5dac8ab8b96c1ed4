import net from "node:net";
import path from "node:path";
import {
  ADAPTER_TYPE_SETTINGS,
  TRAINER_SETTINGS,
  type AdapterTypeSetting,
  type TrainerSetting,
} from "./domain/runs.ts";
import {
  ADAPTER_BATCHING_SETTINGS,
  GPU_SETTINGS,
  type AdapterBatchingSetting,
  type GpuLayers,
  type GpuSetting,
} from "./contract/accelerator.ts";

/**
 * The one typed config module. Every setting has an environment variable, a default and a
 * description; `loadConfig` reads them once at start and nothing else reads `process.env`.
 * docs/settings.md lists every one (test/unit/docs.test.ts checks it).
 */

interface Setting<T> {
  env: string;
  description: string;
  /** Default as shown to users. */
  defaultText: string;
  parse(raw: string | undefined, env: Env): T;
}

type Env = Record<string, string | undefined>;

export class ConfigError extends Error {
  override name = "ConfigError";
}

function integer(env: string, fallback: number, min: number, max = Number.MAX_SAFE_INTEGER) {
  return (raw: string | undefined): number => {
    if (raw === undefined || raw.trim() === "") return fallback;
    const value = Number(raw);
    if (!Number.isInteger(value) || value < min || value > max)
      throw new ConfigError(`${env} must be an integer between ${min} and ${max}, got "${raw}"`);
    return value;
  };
}

function text(fallback: string) {
  return (raw: string | undefined): string =>
    raw === undefined || raw.trim() === "" ? fallback : raw.trim();
}

function optionalText(raw: string | undefined): string | undefined {
  return raw === undefined || raw.trim() === "" ? undefined : raw.trim();
}

const MB = 1024 * 1024;

function dataDirOf(raw: string | undefined): string {
  return path.resolve(text("./data")(raw));
}

function threadsOf(env: Env): number {
  return integer("CONDUIT_THREADS", 1, 1, 256)(env.CONDUIT_THREADS);
}

const parsePort = integer("CONDUIT_PORT", 8080, 0, 65535);
const parseHost = text("127.0.0.1");

export const settings = {
  port: {
    env: "CONDUIT_PORT",
    description: "TCP port the HTTP server listens on.",
    defaultText: "8080",
    parse: parsePort,
  },
  host: {
    env: "CONDUIT_HOST",
    description: "Address to bind. The default only accepts local connections; use `0.0.0.0` to expose it.",
    defaultText: "127.0.0.1",
    parse: parseHost,
  },
  dataDir: {
    env: "CONDUIT_DATA_DIR",
    description: "Directory for the embedded database, uploaded files, models and run artifacts.",
    defaultText: "./data",
    parse: (raw) => dataDirOf(raw),
  },
  databaseUrl: {
    env: "DATABASE_URL",
    description:
      "PostgreSQL connection string (`postgres://user@host:5432/db`). Unset: embedded SQLite in the data dir.",
    defaultText: "unset (SQLite)",
    parse: optionalText,
  },
  apiKeys: {
    env: "CONDUIT_API_KEYS",
    description: "API keys to create at start, as `key:user,key:user`. Keys are stored hashed.",
    defaultText: "unset",
    parse: (raw) => parseApiKeys(raw),
  },
  metricsUsers: {
    env: "CONDUIT_METRICS_USERS",
    description:
      "Users whose keys may read `/metrics`, comma-separated; `*` for every key. The first-start key's user is `default`.",
    defaultText: "`default`",
    parse: (raw) => parseUserList("CONDUIT_METRICS_USERS", raw, ["default"]),
  },
  publicUrl: {
    env: "CONDUIT_PUBLIC_URL",
    description: "Base URL users reach the service at; used for `trackerURL` links.",
    defaultText: "http://{host}:{port}",
    parse: optionalText,
  },
  logLevel: {
    env: "CONDUIT_LOG_LEVEL",
    description: "Log level: fatal, error, warn, info, debug, trace or silent.",
    defaultText: "info",
    parse: (raw) => {
      const level = text("info")(raw);
      if (!["fatal", "error", "warn", "info", "debug", "trace", "silent"].includes(level))
        throw new ConfigError(
          `CONDUIT_LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent`,
        );
      return level;
    },
  },
  bodyLimit: {
    env: "CONDUIT_BODY_LIMIT",
    description:
      "Largest JSON request body in bytes, JSON uploads included (multipart and raw uploads have `CONDUIT_MAX_UPLOAD_BYTES`).",
    defaultText: "1048576 (1 MiB)",
    parse: integer("CONDUIT_BODY_LIMIT", MB, 1024),
  },
  maxUploadBytes: {
    env: "CONDUIT_MAX_UPLOAD_BYTES",
    description: "Largest dataset file in bytes; a bigger upload is refused with 413.",
    defaultText: "104857600 (100 MiB)",
    parse: integer("CONDUIT_MAX_UPLOAD_BYTES", 100 * MB, 1),
  },
  maxAdapterBytes: {
    env: "CONDUIT_MAX_ADAPTER_BYTES",
    description:
      "Largest file of an adapter import (`POST /conduit/models/adapters`: a GGUF LoRA, or a PEFT adapter's safetensors) in bytes; a bigger one is refused with 413.",
    defaultText: "536870912 (512 MiB)",
    parse: integer("CONDUIT_MAX_ADAPTER_BYTES", 512 * MB, 1024),
  },
  maxPairBytes: {
    env: "CONDUIT_MAX_PAIR_BYTES",
    description:
      "Largest IO pair in bytes (a JSONL line, a CSV record, a JSON array item's input and output); an upload holding a bigger one is refused with 400 naming its line, read no further.",
    defaultText: "1048576 (1 MiB)",
    parse: integer("CONDUIT_MAX_PAIR_BYTES", MB, 64),
  },
  maxRunPairs: {
    env: "CONDUIT_MAX_RUN_PAIRS",
    description:
      "Most IO pairs a fine-tuning run may read (training and validation); a run over it is refused at creation with 400.",
    defaultText: "100000",
    parse: integer("CONDUIT_MAX_RUN_PAIRS", 100_000, 1),
  },
  maxRunBytes: {
    env: "CONDUIT_MAX_RUN_BYTES",
    description:
      "Most bytes of dataset files a fine-tuning run may read (training and validation); a run over it is refused at creation with 400.",
    defaultText: "268435456 (256 MiB)",
    parse: integer("CONDUIT_MAX_RUN_BYTES", 256 * MB, 1),
  },
  maxRunTokens: {
    env: "CONDUIT_MAX_RUN_TOKENS",
    description:
      "Most tokens a fine-tuning run may train on: its training examples' tokens (chat template included) times its epochs, within `steps`. Tokens are known once the trainer has tokenized the examples, so a run over it fails then, before its first step, with the numbers.",
    defaultText: "100000000",
    parse: integer("CONDUIT_MAX_RUN_TOKENS", 100_000_000, 1),
  },
  headersTimeout: {
    env: "CONDUIT_HEADERS_TIMEOUT_MS",
    description:
      "Milliseconds a client has to send a request's headers; past it the answer is 408 and the connection closes.",
    defaultText: "30000 (30 s)",
    parse: integer("CONDUIT_HEADERS_TIMEOUT_MS", 30_000, 1),
  },
  bodyTimeout: {
    env: "CONDUIT_BODY_TIMEOUT_MS",
    description:
      "Longest pause in milliseconds while a request body arrives (a stalled upload); past it the answer is 408 and the connection closes.",
    defaultText: "30000 (30 s)",
    parse: integer("CONDUIT_BODY_TIMEOUT_MS", 30_000, 1),
  },
  minBodyRate: {
    env: "CONDUIT_MIN_BODY_RATE",
    description:
      "Slowest average rate, in bytes per second, at which a request body may arrive once it has taken `CONDUIT_BODY_TIMEOUT_MS` (a body trickled a byte at a time); below it the answer is 408 and the connection closes. 0: no minimum.",
    defaultText: "1024",
    parse: integer("CONDUIT_MIN_BODY_RATE", 1024, 0),
  },
  maxConnections: {
    env: "CONDUIT_MAX_CONNECTIONS",
    description:
      "Open client connections the server keeps at once; a connection past it is closed as it arrives. 0: no limit.",
    defaultText: "1024",
    parse: integer("CONDUIT_MAX_CONNECTIONS", 1024, 0),
  },
  maxConnectionsPerAddress: {
    env: "CONDUIT_CONNECTIONS_PER_IP",
    description:
      "Open connections one client address may hold of `CONDUIT_MAX_CONNECTIONS`, so that one client cannot take them all; a connection past it is closed as it arrives and a warning names the address. Connections from a trusted proxy (`CONDUIT_TRUST_PROXY`) are not counted per address. 0: no share.",
    defaultText: "256",
    parse: integer("CONDUIT_CONNECTIONS_PER_IP", 256, 0),
  },
  trustProxy: {
    env: "CONDUIT_TRUST_PROXY",
    description:
      "Reverse proxies whose `X-Forwarded-For` is believed, as Fastify's `trustProxy`: addresses and CIDR ranges separated by commas (`127.0.0.1,10.0.0.0/8`), or a hop count (`1`: the nearest one, whatever its address). Set, a request's client address (for `CONDUIT_MAX_KEY_FAILURES` and the logs) is the nearest address in `X-Forwarded-For` that is not a trusted proxy. Unset: the connection's address, and `X-Forwarded-For` is ignored.",
    defaultText: "unset (no proxy)",
    parse: (raw): TrustProxy | undefined => parseTrustProxy(raw),
  },
  requestTimeout: {
    env: "CONDUIT_REQUEST_TIMEOUT_MS",
    description:
      "Milliseconds a client has to send a whole request, headers and body (a 100 MiB upload then needs 175 KB/s); past it the answer is 408. Not less than `CONDUIT_HEADERS_TIMEOUT_MS`; 0: no limit. Responses, streams included, are not limited.",
    defaultText: "600000 (10 min)",
    parse: (raw, env): number => {
      const value = integer("CONDUIT_REQUEST_TIMEOUT_MS", 600_000, 0)(raw);
      const headers = integer("CONDUIT_HEADERS_TIMEOUT_MS", 30_000, 1)(env.CONDUIT_HEADERS_TIMEOUT_MS);
      if (value > 0 && value < headers)
        throw new ConfigError(
          `CONDUIT_REQUEST_TIMEOUT_MS (${value}) must be 0 or at least CONDUIT_HEADERS_TIMEOUT_MS (${headers})`,
        );
      return value;
    },
  },
  idleTimeout: {
    env: "CONDUIT_IDLE_TIMEOUT_MS",
    description:
      "Milliseconds an idle keep-alive connection stays open; longer than the 60 s idle timeout of common proxies, so none reuses a connection the server just closed.",
    defaultText: "72000 (72 s)",
    parse: integer("CONDUIT_IDLE_TIMEOUT_MS", 72_000, 1),
  },
  shutdownTimeout: {
    env: "CONDUIT_SHUTDOWN_TIMEOUT_MS",
    description:
      "On SIGTERM or SIGINT, milliseconds the requests being answered get to finish before their connections are closed; idle and stalled connections close at once.",
    defaultText: "5000 (5 s)",
    parse: integer("CONDUIT_SHUTDOWN_TIMEOUT_MS", 5_000, 0),
  },
  minFreeBytes: {
    env: "CONDUIT_MIN_FREE_BYTES",
    description:
      "Free bytes on the data directory's disk below which `/healthz` answers `degraded`. A write that finds the disk full is a 507 whatever this is.",
    defaultText: "1073741824 (1 GiB)",
    parse: integer("CONDUIT_MIN_FREE_BYTES", 1024 * MB, 0),
  },
  sweepInterval: {
    env: "CONDUIT_SWEEP_INTERVAL_MS",
    description:
      "How often the server removes leftovers: temp files untouched for an hour (uploads cut off by a crash) and the files of ended runs that nothing serves.",
    defaultText: "600000 (10 min)",
    parse: integer("CONDUIT_SWEEP_INTERVAL_MS", 600_000, 1),
  },
  modelsDir: {
    env: "CONDUIT_MODELS_DIR",
    description: "Directory of `*.gguf` models; each file is a model whose id is its name without `.gguf`.",
    defaultText: "{data dir}/models",
    parse: (raw, env): string =>
      path.resolve(raw?.trim() || path.join(dataDirOf(env.CONDUIT_DATA_DIR), "models")),
  },
  defaultModel: {
    env: "CONDUIT_DEFAULT_MODEL",
    description: "Model used when a request names none, and the default base model of fine-tuning runs.",
    defaultText: "unset",
    parse: optionalText,
  },
  threads: {
    env: "CONDUIT_THREADS",
    description:
      "llama.cpp compute threads per context for generation (a base has `CONDUIT_CONTEXTS` of them). On a small machine more contexts of 1 thread beat fewer contexts of more threads (bench/loraServe.ts; bench/engineThreads.ts measures threads on one context).",
    defaultText: "1",
    parse: (raw): number => threadsOf({ CONDUIT_THREADS: raw }),
  },
  promptThreads: {
    env: "CONDUIT_PROMPT_THREADS",
    description:
      "llama.cpp compute threads for steps that evaluate a prompt (32 tokens or more). More evaluate prompts faster on idle cores; on shared cores keep 1.",
    defaultText: "`CONDUIT_THREADS`",
    parse: (raw, env): number => integer("CONDUIT_PROMPT_THREADS", threadsOf(env), 1, 256)(raw),
  },
  contextSize: {
    env: "CONDUIT_CONTEXT_SIZE",
    description: "Context size (tokens) of each generation sequence, capped at the model's training context.",
    defaultText: "2048",
    parse: integer("CONDUIT_CONTEXT_SIZE", 2048, 64),
  },
  parallelSequences: {
    env: "CONDUIT_PARALLEL",
    description:
      "Generations that run at once per loaded base model (batched sequences), shared by the base and its LoRA adapters.",
    defaultText: "4",
    parse: integer("CONDUIT_PARALLEL", 4, 1, 64),
  },
  contextsPerModel: {
    env: "CONDUIT_CONTEXTS",
    description:
      "Contexts a loaded base's `CONDUIT_PARALLEL` sequences are split among (the same KV cache in all, at most one per sequence). Generations are grouped by LoRA adapter onto contexts, so different adapters decode side by side, each context on `CONDUIT_THREADS` threads. On 2 cores, 2 contexts served 8 streams over 8 adapters 1.8x faster than 1 and one model 1.4-1.7x faster, for 5% more memory; `1` spends fewer CPU-seconds per token (bench/loraServe.ts).",
    defaultText: "2",
    parse: integer("CONDUIT_CONTEXTS", 2, 1, 64),
  },
  maxKeyFailures: {
    env: "CONDUIT_MAX_KEY_FAILURES",
    description:
      "Wrong or missing API keys a client (by address) may send in a minute; past it its requests get `429` until the minute is over, and a warning is logged (`0`: no limit).",
    defaultText: "20",
    parse: integer("CONDUIT_MAX_KEY_FAILURES", 20, 0),
  },
  maxStreamsPerUser: {
    env: "CONDUIT_MAX_STREAMS_PER_USER",
    description:
      "Run event streams (`GET /conduit/finetuning/{id}/events`) one user may hold open at once; past it `429` with `Retry-After`, and a stream's place is free again once its connection closes (`0`: no limit). Streamed generations do not count: the generation queue bounds them.",
    defaultText: "32",
    parse: integer("CONDUIT_MAX_STREAMS_PER_USER", 32, 0),
  },
  maxQueue: {
    env: "CONDUIT_MAX_QUEUE",
    description: "Generations that may wait for a free sequence; past it requests get 429 with Retry-After.",
    defaultText: "32",
    parse: integer("CONDUIT_MAX_QUEUE", 32, 0),
  },
  modelMemoryBudget: {
    env: "CONDUIT_MODEL_MEMORY_BUDGET",
    description: "Bytes of model files kept loaded; least recently used idle models are unloaded past it.",
    defaultText: "8589934592 (8 GiB)",
    parse: integer("CONDUIT_MODEL_MEMORY_BUDGET", 8 * 1024 * MB, 1),
  },
  gpu: {
    env: "CONDUIT_GPU",
    description:
      "Compute backend of generation and training: `auto` (a GPU when the prebuilt binaries find a working one, else the CPU), `cuda`, `vulkan` (the server does not start without it) or `off` (CPU).",
    defaultText: "auto",
    parse: (raw): GpuSetting => {
      const value = text("auto")(raw).toLowerCase();
      if (!(GPU_SETTINGS as readonly string[]).includes(value))
        throw new ConfigError(`CONDUIT_GPU must be one of ${GPU_SETTINGS.join(", ")}, got "${raw}"`);
      return value as GpuSetting;
    },
  },
  adapterBatching: {
    env: "CONDUIT_ADAPTER_BATCHING",
    description:
      "How generations of different LoRA adapters of one base share a decode: `auto` serves any mix in one decode with the mixed-adapter build when `npm run setup:adapters` made it (CPU only), else one decode per adapter in use each token step; `grouped` always does the latter. `/healthz` and the start log say which is in use and why.",
    defaultText: "auto",
    parse: (raw): AdapterBatchingSetting => {
      const value = text("auto")(raw).toLowerCase();
      if (!(ADAPTER_BATCHING_SETTINGS as readonly string[]).includes(value))
        throw new ConfigError(
          `CONDUIT_ADAPTER_BATCHING must be one of ${ADAPTER_BATCHING_SETTINGS.join(", ")}, got "${raw}"`,
        );
      return value as AdapterBatchingSetting;
    },
  },
  adapterType: {
    env: "CONDUIT_ADAPTER_TYPE",
    description:
      "How a LoRA run's adapter is stored and served: `q8_0` (8-bit blocks, a quarter of F32; a tensor whose rows are not a multiple of 32 long stays F16) or `f16`. Many adapters served at once cost what their bytes cost to read each token, so `q8_0` serves them faster; `f16` keeps the trained values to 3 digits. Set when a run is created (its `config.outputType`).",
    defaultText: "q8_0",
    parse: (raw): AdapterTypeSetting => {
      const value = text("q8_0")(raw).toLowerCase();
      if (!(ADAPTER_TYPE_SETTINGS as readonly string[]).includes(value))
        throw new ConfigError(
          `CONDUIT_ADAPTER_TYPE must be one of ${ADAPTER_TYPE_SETTINGS.join(", ")}, got "${raw}"`,
        );
      return value as AdapterTypeSetting;
    },
  },
  gpuLayers: {
    env: "CONDUIT_GPU_LAYERS",
    description:
      "Model layers offloaded to the GPU: `all` or a count (the rest run on the CPU). Ignored on the CPU.",
    defaultText: "all",
    parse: (raw): GpuLayers => {
      const value = text("all")(raw).toLowerCase();
      return value === "all" ? "all" : integer("CONDUIT_GPU_LAYERS", 0, 0, 10_000)(value);
    },
  },
  gpuMemoryBudget: {
    env: "CONDUIT_GPU_MEMORY_BUDGET",
    description:
      "Bytes of GPU memory that loaded models may take (estimated per model at load, counted apart from `CONDUIT_MODEL_MEMORY_BUDGET`); least recently used idle models are unloaded past it.",
    defaultText: "90% of the GPU memory free at start",
    parse: (raw): number | undefined =>
      raw === undefined || raw.trim() === "" ? undefined : integer("CONDUIT_GPU_MEMORY_BUDGET", 0, 1)(raw),
  },
  trainConcurrency: {
    env: "CONDUIT_TRAIN_CONCURRENCY",
    description: "Fine-tuning runs trained at once by this process (0 = this process trains nothing).",
    defaultText: "1",
    parse: integer("CONDUIT_TRAIN_CONCURRENCY", 1, 0, 64),
  },
  evalAfterRun: {
    env: "CONDUIT_EVAL_AFTER_RUN",
    description:
      "When a fine-tuning run with an eval split (its validation file, or the pairs it held out) becomes READY, score its base model and the fine-tune on that split, greedy, with exact match and similarity, and show it on the run (`evaluation`, and a log line such as `base 0/20 → fine-tune 20/20`): `on` or `off`.",
    defaultText: "on",
    parse: (raw): boolean => {
      const value = text("on")(raw).toLowerCase();
      if (["on", "true", "1", "yes"].includes(value)) return true;
      if (["off", "false", "0", "no"].includes(value)) return false;
      throw new ConfigError(`CONDUIT_EVAL_AFTER_RUN must be on or off, got "${raw}"`);
    },
  },
  evalParallel: {
    env: "CONDUIT_EVAL_PARALLEL",
    description:
      "Answers an eval run keeps in flight at once when it does not say (`parallel`): the engine batches them like concurrent chat requests, up to `CONDUIT_PARALLEL` per model, the rest waiting in its queue.",
    defaultText: "8",
    parse: integer("CONDUIT_EVAL_PARALLEL", 8, 1, 64),
  },
  trainThreads: {
    env: "CONDUIT_TRAIN_THREADS",
    description:
      "Compute threads of each trainer, or `auto`: for the torch trainer every core or one fewer, chosen between steps by timing them (torch threads spin-wait: on cores busy elsewhere they train many times slower than one; bench/README.md), 1 for the llama.cpp trainer's own ops (more do not pay there), with every core for the matrix products of its BLAS backend (`npm run setup:trainer`). A number gives both that many.",
    defaultText: "auto",
    parse: (raw): number | "auto" => {
      const value = text("auto")(raw).toLowerCase();
      return value === "auto" ? "auto" : integer("CONDUIT_TRAIN_THREADS", 1, 1, 256)(value);
    },
  },
  trainRanks: {
    env: "CONDUIT_TRAIN_RANKS",
    description:
      "Processes the torch trainer trains each run with on this machine (data-parallel, started by `torchrun` from its Python): each trains a share of every optimizer step's windows and their gradients are summed, so a step averages as many windows as there are ranks; on CUDA one GPU each (`nccl`), on the CPU they share `CONDUIT_TRAIN_THREADS` (`gloo`). `1`: one process, one window a step.",
    defaultText: "1",
    parse: integer("CONDUIT_TRAIN_RANKS", 1, 1, 64),
  },
  trainNodes: {
    env: "CONDUIT_TRAIN_NODES",
    description:
      "Machines a torch run trains on, each with `CONDUIT_TRAIN_RANKS` ranks: this one (the first, which writes everything) and the others, where `torchrun` runs the worker with `--follow` and the same rendezvous (`CONDUIT_TRAIN_RENDEZVOUS`).",
    defaultText: "1",
    parse: (raw, env): number => {
      const nodes = integer("CONDUIT_TRAIN_NODES", 1, 1, 64)(raw);
      if (nodes > 1 && optionalText(env.CONDUIT_TRAIN_RENDEZVOUS) === undefined)
        throw new ConfigError(
          "CONDUIT_TRAIN_NODES above 1 needs CONDUIT_TRAIN_RENDEZVOUS (host:port of this machine that the others reach)",
        );
      return nodes;
    },
  },
  trainRendezvous: {
    env: "CONDUIT_TRAIN_RENDEZVOUS",
    description:
      "`host:port` of this machine that the other machines of a torch run (`CONDUIT_TRAIN_NODES`) connect to: `torchrun`'s `--master-addr` and `--master-port`.",
    defaultText: "unset (one machine)",
    parse: (raw): { host: string; port: number } | undefined => {
      const value = optionalText(raw);
      if (value === undefined) return undefined;
      const at = value.lastIndexOf(":");
      const host = value.slice(0, at).replace(/^\[(.*)\]$/, "$1");
      const port = Number(value.slice(at + 1));
      if (at <= 0 || host === "" || /\s/.test(host) || !Number.isInteger(port) || port < 1 || port > 65535)
        throw new ConfigError(`CONDUIT_TRAIN_RENDEZVOUS must be host:port, got "${value}"`);
      return { host, port };
    },
  },
  trainer: {
    env: "CONDUIT_TRAINER",
    description:
      "Which trainer fine-tunes: `auto` (the PyTorch + PEFT worker when `CONDUIT_PYTHON` has its packages and the run can use it, else the embedded llama.cpp trainer), `llama.cpp` or `torch`. A run's `config.trainer` and log say which trained it and why.",
    defaultText: "auto",
    parse: (raw): TrainerSetting => {
      const value = text("auto")(raw).toLowerCase();
      if (!(TRAINER_SETTINGS as readonly string[]).includes(value))
        throw new ConfigError(`CONDUIT_TRAINER must be one of ${TRAINER_SETTINGS.join(", ")}, got "${raw}"`);
      return value as TrainerSetting;
    },
  },
  trainerBlas: {
    env: "CONDUIT_TRAINER_BLAS",
    description:
      "The BLAS backend the llama.cpp trainer loads on the CPU (`npm run setup:trainer` makes `.cache/trainer-blas/libggml-blas.so`): a library's path, or `off`. With it, LoRA trains on an F32 copy of the base (when that fits a quarter of the memory) at 2–2.5× the speed; `/healthz` and each run's log say whether it is in use.",
    defaultText: "`.cache/trainer-blas/libggml-blas.so` when `npm run setup:trainer` made it, else none",
    parse: (raw): string | undefined => optionalText(raw),
  },
  python: {
    env: "CONDUIT_PYTHON",
    description:
      "The Python of the torch trainer (with the packages of `src/train/torch/requirements.txt`; `npm run setup:torch` makes one in `.cache/torch-venv`).",
    defaultText: "`.cache/torch-venv/bin/python` when that venv exists, else none (no torch trainer)",
    parse: (raw): string | undefined => optionalText(raw),
  },
  mlflowTrackingUri: {
    env: "CONDUIT_MLFLOW_TRACKING_URI",
    description:
      "MLflow tracking server (`http://host:5000`); set, every fine-tuning run is mirrored to it and its `trackerURL` is the MLflow run page.",
    defaultText: "unset (no tracking)",
    parse: (raw): string | undefined => {
      const value = optionalText(raw);
      if (value === undefined) return undefined;
      let url: URL;
      try {
        url = new URL(value);
      } catch {
        throw new ConfigError(`CONDUIT_MLFLOW_TRACKING_URI must be an http(s) URL, got "${value}"`);
      }
      if (url.protocol !== "http:" && url.protocol !== "https:")
        throw new ConfigError(`CONDUIT_MLFLOW_TRACKING_URI must be an http(s) URL, got "${value}"`);
      if (url.username || url.password)
        throw new ConfigError(
          "CONDUIT_MLFLOW_TRACKING_URI must not hold credentials; set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)",
        );
      return value.replace(/\/+$/, "");
    },
  },
  mlflowExperiment: {
    env: "CONDUIT_MLFLOW_EXPERIMENT",
    description: "MLflow experiment of runs that name no `trackerProject` (found or created by name).",
    defaultText: "conduit",
    parse: text("conduit"),
  },
  mlflowTrackingToken: {
    env: "MLFLOW_TRACKING_TOKEN",
    description: "Bearer token sent to the MLflow server, as MLflow's own clients read it.",
    defaultText: "unset",
    parse: optionalText,
  },
  mlflowTrackingUsername: {
    env: "MLFLOW_TRACKING_USERNAME",
    description: "User name for HTTP basic auth to the MLflow server (with `MLFLOW_TRACKING_PASSWORD`).",
    defaultText: "unset",
    parse: optionalText,
  },
  mlflowTrackingPassword: {
    env: "MLFLOW_TRACKING_PASSWORD",
    description: "Password for HTTP basic auth to the MLflow server.",
    defaultText: "unset",
    parse: optionalText,
  },
  serverUrl: {
    env: "CONDUIT_URL",
    description:
      "Server the CLI talks to (every command but `serve` and `keys`). Unset: the server that `CONDUIT_HOST` and `CONDUIT_PORT` describe.",
    defaultText: "http://{CONDUIT_HOST}:{CONDUIT_PORT}",
    parse: (raw, env): string =>
      optionalText(raw) ?? localUrl(parseHost(env.CONDUIT_HOST), parsePort(env.CONDUIT_PORT)),
  },
  pullTimeout: {
    env: "CONDUIT_PULL_TIMEOUT_MS",
    description:
      "Milliseconds `conduit models pull` waits for an answer, or for more bytes of a download, before it gives up naming the reason.",
    defaultText: "20000 (20 s)",
    parse: integer("CONDUIT_PULL_TIMEOUT_MS", 20_000, 1),
  },
  apiKey: {
    env: "CONDUIT_API_KEY",
    description: "API key the CLI sends (or `--key`).",
    defaultText: "unset",
    parse: optionalText,
  },
} satisfies Record<string, Setting<unknown>>;

export type Config = { [K in keyof typeof settings]: ReturnType<(typeof settings)[K]["parse"]> };

export interface ApiKeySeed {
  key: string;
  userId: string;
}

function parseApiKeys(raw: string | undefined): ApiKeySeed[] {
  if (raw === undefined || raw.trim() === "") return [];
  return raw.split(",").map((entry) => {
    const trimmed = entry.trim();
    const colon = trimmed.lastIndexOf(":");
    const key = colon > 0 ? trimmed.slice(0, colon) : "";
    const userId = colon > 0 ? trimmed.slice(colon + 1) : "";
    if (key.length < 8 || !/^[A-Za-z0-9._@-]{1,128}$/.test(userId))
      throw new ConfigError(
        "CONDUIT_API_KEYS must be `key:user,key:user` with keys of at least 8 characters and user ids of letters, digits, . _ @ -",
      );
    return { key, userId };
  });
}

/** Which proxies' `X-Forwarded-For` to believe: the nearest `hops`, or those at `addresses` (addresses and CIDRs). */
export type TrustProxy = { hops: number } | { addresses: string[] };

function parseTrustProxy(raw: string | undefined): TrustProxy | undefined {
  const value = optionalText(raw);
  if (value === undefined) return undefined;
  if (/^\d+$/.test(value)) return { hops: integer("CONDUIT_TRUST_PROXY", 1, 1, 64)(value) };
  const addresses = value.split(",").map((entry) => entry.trim());
  for (const entry of addresses) {
    const [address = "", prefix, ...rest] = entry.split("/");
    const family = net.isIP(address);
    const bits = family === 4 ? 32 : 128;
    const validPrefix = prefix === undefined || (/^\d{1,3}$/.test(prefix) && Number(prefix) <= bits);
    if (family === 0 || !validPrefix || rest.length > 0)
      throw new ConfigError(
        `CONDUIT_TRUST_PROXY must be a hop count or addresses and CIDR ranges separated by commas (127.0.0.1,10.0.0.0/8), got "${entry}"`,
      );
  }
  return { addresses };
}

function parseUserList(env: string, raw: string | undefined, fallback: string[]): string[] {
  if (raw === undefined || raw.trim() === "") return fallback;
  const users = raw.split(",").map((user) => user.trim());
  if (!users.every((user) => user === "*" || /^[A-Za-z0-9._@-]{1,128}$/.test(user)))
    throw new ConfigError(`${env} must be user ids (letters, digits, . _ @ -) separated by commas, or *`);
  return users;
}

/** Reads every setting once. Throws a `ConfigError` naming the variable on a bad value. */
export function loadConfig(env: Env = process.env): Config {
  const config: Record<string, unknown> = {};
  for (const [name, setting] of Object.entries(settings) as [string, Setting<unknown>][])
    config[name] = setting.parse(env[setting.env], env);
  return config as Config;
}

/** The effective config for the start-up log, secrets masked. */
/** Query parameters of a URL that hold a credential (PostgreSQL's `password`, `sslpassword`; tokens and keys). */
const SECRET_PARAMS =
  /^(password|passwd|pass|pwd|sslpassword|sslkey|secret|token|access_token|auth|api[_-]?key|key)$/i;

/**
 * A URL fit for a log: the password of its user info and every query parameter that holds a credential are
 * `***`. A value that does not parse as a URL has both forms replaced by pattern.
 */
export function redactUrl(value: string): string {
  try {
    const url = new URL(value);
    if (url.password) url.password = "***";
    for (const name of [...url.searchParams.keys()])
      if (SECRET_PARAMS.test(name)) url.searchParams.set(name, "***");
    // URLSearchParams escapes the asterisks it wrote.
    return url.toString().replace(/%2A%2A%2A/g, "***");
  } catch {
    return value
      .replace(/\/\/([^:@/]*):[^@/]*@/, "//$1:***@")
      .replace(
        /([?&;\s](?:password|passwd|pass|pwd|sslpassword|secret|token|access_token|api[_-]?key|key)=)[^&;\s]*/gi,
        "$1***",
      );
  }
}

export function describeConfig(config: Config): Record<string, unknown> {
  return {
    ...config,
    databaseUrl: config.databaseUrl === undefined ? undefined : redactUrl(config.databaseUrl),
    publicUrl: config.publicUrl === undefined ? undefined : redactUrl(config.publicUrl),
    mlflowTrackingUri:
      config.mlflowTrackingUri === undefined ? undefined : redactUrl(config.mlflowTrackingUri),
    apiKeys: config.apiKeys.map((k) => `***:${k.userId}`),
    apiKey: config.apiKey ? "***" : undefined,
    mlflowTrackingToken: config.mlflowTrackingToken ? "***" : undefined,
    mlflowTrackingPassword: config.mlflowTrackingPassword ? "***" : undefined,
  };
}

/** The URL of a server listening on `host:port`, as a client on this machine reaches it (`0.0.0.0` → `127.0.0.1`). */
export function localUrl(host: string, port: number): string {
  const reachable = host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host;
  return `http://${reachable.includes(":") ? `[${reachable}]` : reachable}:${port}`;
}

export function publicUrl(config: Config): string {
  if (config.publicUrl) return config.publicUrl.replace(/\/+$/, "");
  const host = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
  return `http://${host.includes(":") ? `[${host}]` : host}:${config.port}`;
}
