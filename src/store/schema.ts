/** Table types of the metadata database (same schema on SQLite and PostgreSQL). */

export interface ApiKeyTable {
  id: string;
  user_id: string;
  name: string;
  /** The first characters of the key, to tell keys apart in listings. */
  prefix: string;
  /** SHA-256 of the key, hex. Keys are random 32-byte secrets, so a fast hash is enough. */
  hash: string;
  created_at: string;
}

export interface DatasetTable {
  id: string;
  user_id: string;
  name: string;
  io_pairs_count: number;
  status: string;
  created_at: string;
  updated_at: string;
}

export interface FileTable {
  id: string;
  dataset_id: string;
  user_id: string;
  name: string;
  size: number;
  type: string;
  format: string;
  io_pairs_count: number;
  /** Blob key under the data dir's blob folder. */
  blob: string;
  created_at: string;
  updated_at: string;
}

export interface RunTable {
  id: string;
  user_id: string;
  dataset_id: string;
  dataset_name: string;
  name: string;
  io_pairs_count: number;
  status: string;
  tracker_url: string;
  /** JSON object. */
  config: string;
  /** JSON object. */
  stats: string;
  /** Set when the run ends in FAILED. */
  error: string | null;
  /** Path of the served model once READY. */
  model_path: string | null;
  /** Worker holding the run while RUNNING, and until when (lease + heartbeat). */
  lease_owner: string | null;
  lease_expires_at: string | null;
  /** How many times a trainer has started this run (crash recovery re-queues it). */
  attempts: number;
  /** The MLflow experiment and run this run is mirrored to (`CONDUIT_MLFLOW_TRACKING_URI`), once created. */
  mlflow_experiment_id: string | null;
  mlflow_run_id: string | null;
  /** JSON `RunPlan`: the estimate made when the run was created; null for runs created before estimates. */
  estimate: string | null;
  created_at: string;
  updated_at: string;
}

export interface RunLogTable {
  run_id: string;
  seq: number;
  line: string;
  created_at: string;
}

/** An evaluation: its graders and where its items come from (`src/evals/`). */
export interface EvalTable {
  id: string;
  user_id: string;
  name: string;
  /** JSON `EvalConfig`: graders, item source, system prompt, what the OpenAI face was asked. */
  config: string;
  /** The fine-tuning run this eval was made for (the automatic before/after); null otherwise. */
  run_id: string | null;
  created_at: string;
  updated_at: string;
}

/** One scoring of models on an eval's items. */
export interface EvalRunTable {
  id: string;
  eval_id: string;
  user_id: string;
  name: string;
  status: string;
  /** JSON array of the model names asked for. */
  models: string;
  /** JSON array of the items, as resolved when the run was created. */
  items: string;
  /** JSON `EvalRunConfig`: graders, system prompts, max tokens, parallel answers. */
  config: string;
  /** JSON `EvalRunProgress`. */
  progress: string;
  /** JSON `ModelTotals[]`, written as answers are scored. */
  results: string;
  error: string | null;
  created_at: string;
  updated_at: string;
}

/** One model's answer to one item of an eval run, with its scores. */
export interface EvalResultTable {
  run_id: string;
  model_index: number;
  item_index: number;
  model: string;
  answer: string;
  /** JSON `GraderScore[]`. */
  scores: string;
  latency_ms: number;
  prompt_tokens: number;
  completion_tokens: number;
  error: string | null;
  created_at: string;
}

/** A LoRA adapter imported for a base model (not trained here): `POST /conduit/models/adapters`. */
export interface AdapterTable {
  id: string;
  user_id: string;
  name: string;
  /** The models-directory model it applies to. */
  base_model: string;
  /** What was uploaded: `gguf` (a llama.cpp LoRA) or `peft` (safetensors + adapter_config.json, converted). */
  format: string;
  rank: number;
  alpha: number;
  /** Base weights it adapts. */
  weights: number;
  /** Bytes of the stored GGUF adapter. */
  size_bytes: number;
  /** Absolute path of the stored GGUF adapter (under the data dir's blobs, a generated name). */
  path: string;
  created_at: string;
}

export interface Database {
  api_keys: ApiKeyTable;
  datasets: DatasetTable;
  files: FileTable;
  runs: RunTable;
  run_logs: RunLogTable;
  evals: EvalTable;
  eval_runs: EvalRunTable;
  eval_results: EvalResultTable;
  adapters: AdapterTable;
}
