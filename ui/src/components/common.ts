import { cloneElement, h, isValidElement, type ComponentChildren, type VNode } from "preact";
import { useId } from "preact/hooks";
import type { RunStatus } from "../api.ts";

/** An error in plain words, announced to screen readers. */
export function ErrorNote({ message }: { message: string | undefined }) {
  if (!message) return null;
  return h("p", { class: "note error", role: "alert" }, message);
}

export function Loading({ what }: { what: string }) {
  return h("p", { class: "muted", role: "status" }, `Loading ${what}…`);
}

export function StatusBadge({ status }: { status: RunStatus | "DELETED" }) {
  return h("span", { class: `badge badge-${status.toLowerCase()}` }, status);
}

/**
 * A labelled form field. The control (the one child) gets an id for the label and is described
 * by the hint, so screen readers read "Epochs, 3, Passes over the data…".
 */
export function Field(props: {
  label: string;
  hint?: string;
  wide?: boolean;
  /** The control is a checkbox: it sits before its label. */
  check?: boolean;
  children?: ComponentChildren;
}) {
  const id = useId();
  const hintId = `${id}-hint`;
  return h(
    "div",
    { class: ["field", props.wide && "wide", props.check && "check"].filter(Boolean).join(" ") },
    h("label", { for: id }, props.label),
    isValidElement(props.children)
      ? cloneElement(
          props.children as VNode<ControlProps>,
          props.hint ? { id, "aria-describedby": hintId } : { id },
        )
      : props.children,
    props.hint ? h("small", { class: "hint", id: hintId }, props.hint) : null,
  );
}

interface ControlProps {
  id?: string;
  "aria-describedby"?: string;
}

/**
 * Tables scroll sideways on narrow screens instead of overflowing the page; a table with class
 * `stack` and a `data-label` on each cell shows one card per row on phones instead.
 */
export function TableScroll({ label, children }: { label: string; children?: ComponentChildren }) {
  return h("div", { class: "table-scroll", role: "region", "aria-label": label, tabIndex: 0 }, children);
}
