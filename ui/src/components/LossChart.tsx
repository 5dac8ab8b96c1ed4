import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import type { RunStats } from "../api.ts";
import { formatNumber } from "../format.ts";

type Series = Pick<RunStats, "lossSeries" | "evalLossSeries">;

/** uPlot wants one x array with the y values aligned to it: the union of train and eval steps. */
export function alignLoss({ lossSeries = [], evalLossSeries = [] }: Series): uPlot.AlignedData {
  const train = new Map(lossSeries.map((p) => [p.step, p.trainLoss]));
  const evals = new Map(evalLossSeries.map((p) => [p.step, p.evalLoss]));
  const steps = [...new Set([...train.keys(), ...evals.keys()])].sort((a, b) => a - b);
  return [steps, steps.map((s) => train.get(s) ?? null), steps.map((s) => evals.get(s) ?? null)];
}

const chartHeight = 260;
/** Steps are whole numbers: no 1.5 on the axis. */
const stepIncrements = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000];

/** The run's train and eval loss by step, redrawn as `stats` events arrive. */
export function LossChart({ stats }: { stats: Series }) {
  const container = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const data = alignLoss(stats);

  useEffect(() => {
    const element = container.current;
    if (!element) return;
    const axis = { stroke: "#8a8f98", grid: { stroke: "rgba(138, 143, 152, 0.2)" }, ticks: { show: false } };
    const chart = new uPlot(
      {
        width: Math.max(element.clientWidth, 200),
        height: chartHeight,
        scales: { x: { time: false } },
        axes: [
          { ...axis, label: "step", incrs: stepIncrements },
          { ...axis, label: "loss", size: 60 },
        ],
        series: [
          { label: "step" },
          {
            label: "train loss",
            stroke: "#2f6fde",
            width: 2,
            value: (_u, v) => formatNumber(v ?? undefined),
          },
          {
            label: "eval loss",
            stroke: "#e2711d",
            width: 2,
            spanGaps: true,
            points: { show: true, size: 7 },
            value: (_u, v) => formatNumber(v ?? undefined),
          },
        ],
        legend: { live: true },
      },
      alignLoss({}),
      element,
    );
    plot.current = chart;
    const resize = new ResizeObserver(() =>
      chart.setSize({ width: Math.max(element.clientWidth, 200), height: chartHeight }),
    );
    resize.observe(element);
    return () => {
      resize.disconnect();
      chart.destroy();
      plot.current = null;
    };
  }, []);

  useEffect(() => {
    plot.current?.setData(data);
  });

  const steps = data[0];
  const lastTrain = stats.lossSeries?.at(-1);
  const lastEval = stats.evalLossSeries?.at(-1);
  const summary =
    steps.length === 0
      ? "No loss reported yet."
      : `Loss over ${steps.length} steps.` +
        (lastTrain ? ` Train loss ${formatNumber(lastTrain.trainLoss)} at step ${lastTrain.step}.` : "") +
        (lastEval ? ` Eval loss ${formatNumber(lastEval.evalLoss)} at step ${lastEval.step}.` : "");
  return (
    <figure class="chart">
      <div ref={container} class="chart-canvas" role="img" aria-label={summary} />
      <figcaption class={steps.length === 0 ? "muted" : "visually-hidden"}>{summary}</figcaption>
    </figure>
  );
}
