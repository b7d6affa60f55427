/**
 * Element types (PROTOCOL.md §5.1) and the typed array that holds each one.
 *
 * | dtype  | typed array      | note                                                  |
 * |--------|------------------|-------------------------------------------------------|
 * | bool   | Uint8Array       | one byte per element, 0 or 1                          |
 * | u8     | Uint8Array       |                                                       |
 * | i8     | Int8Array        |                                                       |
 * | u16    | Uint16Array      |                                                       |
 * | i16    | Int16Array       |                                                       |
 * | u32    | Uint32Array      |                                                       |
 * | i32    | Int32Array       |                                                       |
 * | u64    | BigUint64Array   | elements are `bigint`                                 |
 * | i64    | BigInt64Array    | elements are `bigint`                                 |
 * | f16    | Uint16Array      | raw IEEE 754 half bits: use `f16ToNumber` / `numberToF16` |
 * | bf16   | Uint16Array      | raw bfloat16 bits: use `bf16ToNumber` / `numberToBf16`    |
 * | f32    | Float32Array     |                                                       |
 * | f64    | Float64Array     |                                                       |
 * | f8e4m3fn | Uint8Array     | raw float8 bits: `f8e4m3fnToNumber` / `numberToF8e4m3fn` |
 * | f8e5m2 | Uint8Array       | raw float8 bits: `f8e5m2ToNumber` / `numberToF8e5m2`  |
 * | c64    | Float32Array     | two entries per element: real, imaginary (interleaved) |
 * | c128   | Float64Array     | two entries per element: real, imaginary (interleaved) |
 *
 * JavaScript has no float8 or complex typed arrays: float8 tensors hold their bit
 * patterns (as f16 and bf16 do), complex tensors `lanes(dtype) == 2` numbers per element,
 * so their `data.length` is twice the number of elements.
 */

import { DTYPES, ITEM_SIZES } from "./constants.js";

/** The wire name of an element type (the protocol's list, generated from the Rust table). */
export type DType = (typeof DTYPES)[number];

/** Every dtype, in the order of PROTOCOL.md §5.1. */
export { DTYPES };

/** The typed array that holds the elements of each dtype. */
export interface TypedArrayFor {
  bool: Uint8Array;
  u8: Uint8Array;
  i8: Int8Array;
  u16: Uint16Array;
  i16: Int16Array;
  u32: Uint32Array;
  i32: Int32Array;
  u64: BigUint64Array;
  i64: BigInt64Array;
  f16: Uint16Array;
  bf16: Uint16Array;
  f32: Float32Array;
  f64: Float64Array;
  f8e4m3fn: Uint8Array;
  f8e5m2: Uint8Array;
  c64: Float32Array;
  c128: Float64Array;
}

/** Any typed array a tensor may hold. */
export type TypedArray = TypedArrayFor[DType];

/** A constructor of one of the typed arrays above. */
export interface TypedArrayConstructor<T extends TypedArray = TypedArray> {
  new (length: number): T;
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): T;
  readonly BYTES_PER_ELEMENT: number;
}

const CTORS: { [D in DType]: TypedArrayConstructor<TypedArrayFor[D]> } = {
  bool: Uint8Array,
  u8: Uint8Array,
  i8: Int8Array,
  u16: Uint16Array,
  i16: Int16Array,
  u32: Uint32Array,
  i32: Int32Array,
  u64: BigUint64Array,
  i64: BigInt64Array,
  f16: Uint16Array,
  bf16: Uint16Array,
  f32: Float32Array,
  f64: Float64Array,
  f8e4m3fn: Uint8Array,
  f8e5m2: Uint8Array,
  c64: Float32Array,
  c128: Float64Array,
};

/** Whether `s` is a dtype name. */
export function isDType(s: unknown): s is DType {
  return typeof s === "string" && Object.prototype.hasOwnProperty.call(CTORS, s);
}

/** Typed-array entries per element of `dtype`: 2 for `c64` and `c128` (real, imaginary), else 1. */
export function lanes(dtype: DType): number {
  return dtype === "c64" || dtype === "c128" ? 2 : 1;
}

/** Bytes per element of `dtype`. */
export function itemSize(dtype: DType): number {
  return ITEM_SIZES[dtype];
}

/** The typed array constructor for `dtype`. */
export function arrayType<D extends DType>(dtype: D): TypedArrayConstructor<TypedArrayFor[D]> {
  return CTORS[dtype];
}

/**
 * The dtype a typed array stands for when no dtype is given: Uint8Array is `u8` (say
 * `"bool"`, `"f8e4m3fn"` or `"f8e5m2"` explicitly), Uint16Array is `u16` (say `"f16"` or
 * `"bf16"` explicitly), Float32Array and Float64Array are `f32` and `f64` (say `"c64"` or
 * `"c128"` explicitly).
 */
export function dtypeOf(a: TypedArray): DType {
  if (a instanceof Float32Array) return "f32";
  if (a instanceof Float64Array) return "f64";
  if (a instanceof Uint8Array) return "u8";
  if (a instanceof Int8Array) return "i8";
  if (a instanceof Uint16Array) return "u16";
  if (a instanceof Int16Array) return "i16";
  if (a instanceof Uint32Array) return "u32";
  if (a instanceof Int32Array) return "i32";
  if (a instanceof BigUint64Array) return "u64";
  if (a instanceof BigInt64Array) return "i64";
  throw new TypeError(`no dtype for ${Object.prototype.toString.call(a)}`);
}

/** Whether `a` is the typed array class that holds `dtype` (Uint8ClampedArray is not accepted). */
export function holds(dtype: DType, a: unknown): a is TypedArrayFor[DType] {
  return a instanceof CTORS[dtype] && !(a instanceof Uint8ClampedArray);
}

// ---- f16 / bf16 bit conversions -----------------------------------------------------------

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The number an IEEE 754 half-precision bit pattern stands for. */
export function f16ToNumber(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const frac = bits & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 0x1f) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** The IEEE 754 half-precision bits nearest to `x` (round to nearest even). */
export function numberToF16(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let frac = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (frac ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    frac |= 0x800000;
    const shift = 14 - e;
    let half = frac >>> shift;
    const rem = frac & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rem > mid || (rem === mid && half & 1)) half++;
    return sign | half;
  }
  let half = (e << 10) | (frac >>> 13);
  const rem = frac & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && half & 1)) half++;
  e = half >> 10;
  return sign | (e >= 0x1f ? 0x7c00 : half);
}

/** The number a bfloat16 bit pattern stands for. */
export function bf16ToNumber(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0]!;
}

/** The bfloat16 bits nearest to `x` (round to nearest even; NaN stays NaN). */
export function numberToBf16(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  if ((b & 0x7f800000) === 0x7f800000 && b & 0x7fffff) return ((b >>> 16) | 0x40) & 0xffff;
  const rounded = b + 0x7fff + ((b >>> 16) & 1);
  return (rounded >>> 16) & 0xffff;
}

// ---- float8 bit conversions ---------------------------------------------------------------
// (PROTOCOL.md §5.1: e4m3fn has no infinities and one NaN pattern per sign, largest finite
// 448; e5m2 is the upper byte of an f16. Rounding and overflow as torch and ml_dtypes do.)

/** The number an f8e4m3fn bit pattern stands for. */
export function f8e4m3fnToNumber(bits: number): number {
  const sign = bits & 0x80 ? -1 : 1;
  const exp = (bits >> 3) & 0xf;
  const man = bits & 0x7;
  if (exp === 0xf && man === 0x7) return NaN;
  if (exp === 0) return sign * man * 2 ** -9;
  return sign * (1 + man / 8) * 2 ** (exp - 7);
}

/** The number an f8e5m2 bit pattern stands for. */
export function f8e5m2ToNumber(bits: number): number {
  return f16ToNumber((bits & 0xff) << 8);
}

/**
 * The float8 bits nearest to `x` (ties to even) of a format with `manBits` mantissa bits and
 * exponent bias `bias`; a finite value rounding past `maxFinite` (bits without the sign)
 * becomes `overflow`.
 */
function toF8(x: number, manBits: number, bias: number, maxFinite: number, overflow: number, inf: number, nan: number): number {
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  if (Number.isNaN(x)) return nan;
  const a = Math.abs(x);
  if (a === Infinity) return sign | inf;
  const minExp = 1 - bias;
  let scaled: number;
  let base = 0;
  if (a < 2 ** minExp) {
    scaled = a * 2 ** (manBits - minExp); // subnormal: exact scaling by a power of two
  } else {
    let e = Math.floor(Math.log2(a));
    if (2 ** e > a) e--; // (log2 may round up just below a power of two)
    else if (2 ** (e + 1) <= a) e++;
    if (e + bias > 0x1f) return sign | overflow;
    base = (e + bias) << manBits;
    scaled = (a / 2 ** e - 1) * 2 ** manBits; // exact: the mantissa bits, a fraction of them left
  }
  const floor = Math.floor(scaled);
  const rest = scaled - floor;
  let n = base + floor;
  if (rest > 0.5 || (rest === 0.5 && n & 1)) n++; // (a carry into the exponent is right)
  if (n > maxFinite) return sign | overflow;
  return sign | n;
}

/** The f8e4m3fn bits nearest to `x` (ties to even; past 448, and infinities, are NaN). */
export function numberToF8e4m3fn(x: number): number {
  return toF8(x, 3, 7, 0x7e, 0x7f, 0x7f, 0x7f);
}

/** The f8e5m2 bits nearest to `x` (ties to even; overflow is infinity; NaN is 0x7e). */
export function numberToF8e5m2(x: number): number {
  return toF8(x, 2, 15, 0x7b, 0x7c, 0x7c, 0x7e);
}
