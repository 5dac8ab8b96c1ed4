import type { ComponentChildren } from "preact";
import { Loading } from "./common.tsx";

/** A column of a `Table`. */
export interface Column<T> {
  /** The header; on phones, where each row is a card, also each cell's label. */
  label: string;
  /** The cell of a row. */
  cell: (row: T) => ComponentChildren;
  /** A number column: right-aligned. Defaults to `false`. */
  num?: boolean;
  /** The buttons of a row: the header is for screen readers only, and the cell has no label. Defaults to `false`. */
  actions?: boolean;
}

export interface TableProps<T> {
  /** Names the table's scroll box for screen readers ("Datasets", "Files", ...). */
  label: string;
  columns: Column<T>[];
  /** The rows; `undefined` while they load. */
  rows: T[] | undefined;
  rowKey: (row: T) => string | number;
  /** A class for a row (the selected one, say). Defaults to none. */
  rowClass?: (row: T) => string | undefined;
  /** What is loading, for "Loading files…" while `rows` is `undefined`; nothing is shown when left out (an error, say). */
  loading?: string | undefined;
  /** Said instead of the table when there are no rows. Defaults to an empty table. */
  empty?: ComponentChildren;
  /** More classes for the table (`pairs` for long texts). Defaults to none. */
  class?: string;
}

/**
 * The dashboard's one table. It scrolls sideways on narrow screens instead of overflowing the page,
 * and on phones shows one card per row, each cell labelled by its column (`stack`, `data-label`).
 */
export function Table<T>({
  label,
  columns,
  rows,
  rowKey,
  rowClass,
  loading,
  empty,
  class: extra,
}: TableProps<T>) {
  if (rows === undefined) return loading === undefined ? null : <Loading what={loading} />;
  if (rows.length === 0 && empty !== undefined) return <p class="muted">{empty}</p>;
  return (
    <div class="table-scroll" role="region" aria-label={label} tabIndex={0}>
      <table class={extra ? `${extra} stack` : "stack"}>
        <thead>
          <tr>
            {columns.map((column) => (
              <th key={column.label} scope="col" class={column.num ? "num" : undefined}>
                {column.actions ? <span class="visually-hidden">{column.label}</span> : column.label}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {rows.map((row) => (
            <tr key={rowKey(row)} class={rowClass?.(row)}>
              {columns.map((column) => (
                <td
                  key={column.label}
                  class={column.actions ? "actions" : column.num ? "num" : undefined}
                  data-label={column.actions ? undefined : column.label}
                >
                  {column.cell(row)}
                </td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
