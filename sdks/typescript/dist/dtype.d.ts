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
import { DTYPES } from "./constants.js";
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
/** Whether `s` is a dtype name. */
export declare function isDType(s: unknown): s is DType;
/** Typed-array entries per element of `dtype`: 2 for `c64` and `c128` (real, imaginary), else 1. */
export declare function lanes(dtype: DType): number;
/** Bytes per element of `dtype`. */
export declare function itemSize(dtype: DType): number;
/** The typed array constructor for `dtype`. */
export declare function arrayType<D extends DType>(dtype: D): TypedArrayConstructor<TypedArrayFor[D]>;
/**
 * The dtype a typed array stands for when no dtype is given: Uint8Array is `u8` (say
 * `"bool"`, `"f8e4m3fn"` or `"f8e5m2"` explicitly), Uint16Array is `u16` (say `"f16"` or
 * `"bf16"` explicitly), Float32Array and Float64Array are `f32` and `f64` (say `"c64"` or
 * `"c128"` explicitly).
 */
export declare function dtypeOf(a: TypedArray): DType;
/** Whether `a` is the typed array class that holds `dtype` (Uint8ClampedArray is not accepted). */
export declare function holds(dtype: DType, a: unknown): a is TypedArrayFor[DType];
/** The number an IEEE 754 half-precision bit pattern stands for. */
export declare function f16ToNumber(bits: number): number;
/** The IEEE 754 half-precision bits nearest to `x` (round to nearest even). */
export declare function numberToF16(x: number): number;
/** The number a bfloat16 bit pattern stands for. */
export declare function bf16ToNumber(bits: number): number;
/** The bfloat16 bits nearest to `x` (round to nearest even; NaN stays NaN). */
export declare function numberToBf16(x: number): number;
/** The number an f8e4m3fn bit pattern stands for. */
export declare function f8e4m3fnToNumber(bits: number): number;
/** The number an f8e5m2 bit pattern stands for. */
export declare function f8e5m2ToNumber(bits: number): number;
/** The f8e4m3fn bits nearest to `x` (ties to even; past 448, and infinities, are NaN). */
export declare function numberToF8e4m3fn(x: number): number;
/** The f8e5m2 bits nearest to `x` (ties to even; overflow is infinity; NaN is 0x7e). */
export declare function numberToF8e5m2(x: number): number;
