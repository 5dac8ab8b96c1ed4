import { trainableBlocks } from "../core/modelFile.ts";

/**
 * Decides which model tensors train for a given `complexity` (the fraction of transformer blocks,
 * counted from the top, that train). Used as llama.cpp's `llama_opt_param_filter`.
 *
 * - `blk.N.*` trains when block N is among the top `ceil(complexity * nLayers)` blocks.
 * - `output.*` and `output_norm.*` always train: they sit above every block, and the top blocks'
 *   updates are useless if the head that reads them cannot adapt.
 * - `token_embd.*` never trains (this llama.cpp release skips it; its gradient is not implemented).
 * - `blk.N.attn_k.*` and `blk.N.attn_v.*` never train (no gradient reaches them in this release).
 * - Any other tensor (position embeddings, input norms) trains only at complexity 1, since it sits
 *   below the lowest block.
 */
export function isTrainableTensor(name: string, nLayers: number, complexity: number): boolean {
  if (name.startsWith("token_embd.")) return false;
  // Keys and values reach attention through the KV cache (set_rows), which has no backward pass here: they
  // would get no gradient, only AdamW's weight decay shrinking them step after step.
  if (/^blk\.\d+\.attn_[kv]\./.test(name)) return false;
  if (name.startsWith("output.") || name.startsWith("output_norm.")) return true;
  const block = /^blk\.(\d+)\./.exec(name);
  if (block === null) return complexity >= 1;
  return Number(block[1]) >= nLayers - trainableBlocks(nLayers, complexity);
}
