const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/**
 * IEEE 754 half-precision bits of `value`, rounded to nearest even as ggml's `GGML_FP32_TO_FP16` does
 * (Node 20 has no `Float16Array`). Overflow becomes infinity; NaN stays NaN.
 */
export function float32ToFloat16(value: number): number {
  f32[0] = value;
  const x = u32[0] as number;
  const sign = (x >>> 16) & 0x8000;
  const exponent = (x >>> 23) & 0xff;
  const mantissa = x & 0x7fffff;

  if (exponent === 0xff) return sign | 0x7c00 | (mantissa !== 0 ? 0x200 : 0);

  // Unbiased exponent, rebiased for half precision (bias 15).
  const e = exponent - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // Subnormal half (or zero): shift the mantissa with its implicit leading 1 into place.
    if (e < -10) return sign;
    const m = mantissa | 0x800000;
    const shift = 14 - e;
    const half = m >>> shift;
    const rest = m & ((1 << shift) - 1);
    const midpoint = 1 << (shift - 1);
    const roundUp = rest > midpoint || (rest === midpoint && (half & 1) === 1);
    return sign | (half + (roundUp ? 1 : 0));
  }
  const half = (e << 10) | (mantissa >>> 13);
  const rest = mantissa & 0x1fff;
  // A carry out of the mantissa correctly bumps the exponent (up to infinity).
  const roundUp = rest > 0x1000 || (rest === 0x1000 && (half & 1) === 1);
  return sign | (half + (roundUp ? 1 : 0));
}

/** The float value of half-precision bits `h` (for tests and readers). */
export function float16ToFloat32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >>> 10) & 0x1f;
  const mantissa = h & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}
