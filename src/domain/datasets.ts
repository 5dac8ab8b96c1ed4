/** Datasets and their files as the domain knows them (the store keeps them, the services hand them out). */

export type DatasetStatus = "READY";

export interface Dataset {
  id: string;
  userId: string;
  name: string;
  ioPairsCount: number;
  status: DatasetStatus;
  createdAt: string;
  updatedAt: string;
}

export interface DatasetFile {
  id: string;
  datasetId: string;
  userId: string;
  name: string;
  size: number;
  type: "IO";
  format: string;
  ioPairsCount: number;
  blob: string;
  createdAt: string;
  updatedAt: string;
}

/** A page of a list: at most `limit` items after the first `offset`. */
export interface Page {
  limit: number;
  offset: number;
}
