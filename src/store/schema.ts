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

export interface Database {
  api_keys: ApiKeyTable;
  datasets: DatasetTable;
  files: FileTable;
  runs: RunTable;
  run_logs: RunLogTable;
}
