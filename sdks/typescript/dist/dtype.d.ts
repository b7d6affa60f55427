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
 */
/** The wire name of an element type. */
export type DType = "bool" | "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "u64" | "i64" | "f16" | "bf16" | "f32" | "f64";
/** Every dtype, in the order of PROTOCOL.md §5.1. */
export declare const DTYPES: readonly DType[];
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
/** Bytes per element of `dtype`. */
export declare function itemSize(dtype: DType): number;
/** The typed array constructor for `dtype`. */
export declare function arrayType<D extends DType>(dtype: D): TypedArrayConstructor<TypedArrayFor[D]>;
/**
 * The dtype a typed array stands for when no dtype is given: Uint8Array is `u8` (say
 * `"bool"` explicitly), Uint16Array is `u16` (say `"f16"` or `"bf16"` explicitly).
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
