import { cloneElement, isValidElement, type ComponentChildren, type VNode } from "preact";
import { useId } from "preact/hooks";
import type { RunStatus } from "../api.ts";

/** An error in plain words, announced to screen readers. */
export function ErrorNote({ message }: { message: string | undefined }) {
  if (!message) return null;
  return (
    <p class="note error" role="alert">
      {message}
    </p>
  );
}

export function Loading({ what }: { what: string }) {
  return (
    <p class="muted" role="status">
      {`Loading ${what}…`}
    </p>
  );
}

export function StatusBadge({ status }: { status: RunStatus | "DELETED" }) {
  return <span class={`badge badge-${status.toLowerCase()}`}>{status}</span>;
}

interface ControlProps {
  id?: string;
  "aria-describedby"?: string;
}

/**
 * A labelled form field. The control (the one child) gets an id for the label and is described
 * by the hint, so screen readers read "Epochs, 3, Passes over the data…".
 */
export function Field(props: {
  label: string;
  hint?: string | undefined;
  wide?: boolean;
  /** The control is a checkbox: it sits before its label. */
  check?: boolean;
  children?: ComponentChildren;
}) {
  const id = useId();
  const hintId = `${id}-hint`;
  const control = isValidElement(props.children)
    ? cloneElement(
        props.children as VNode<ControlProps>,
        props.hint ? { id, "aria-describedby": hintId } : { id },
      )
    : props.children;
  return (
    <div class={["field", props.wide && "wide", props.check && "check"].filter(Boolean).join(" ")}>
      <label for={id}>{props.label}</label>
      {control}
      {props.hint ? (
        <small class="hint" id={hintId}>
          {props.hint}
        </small>
      ) : null}
    </div>
  );
}
