import { type DType, type TypedArray, type TypedArrayFor } from "./dtype.js";
/** What `Tensor.from` accepts as elements. */
export type TensorInput = TypedArray | ArrayLike<number> | ArrayLike<bigint> | ArrayLike<boolean>;
/**
 * A CPU tensor: an element type, a shape and a typed array of the elements.
 *
 * `data` is the typed array of the dtype (see `dtype.ts`): `BigInt64Array` /
 * `BigUint64Array` for 64-bit integers, `Uint8Array` for `bool` (0 or 1), and for `f16` and
 * `bf16` a `Uint16Array` of the **raw bits** (JavaScript has no 16-bit float array in
 * Node 20): convert with `toNumbers()`, `Tensor.from(numbers, shape, "f16")`, or
 * `f16ToNumber` / `numberToF16` and `bf16ToNumber` / `numberToBf16`. The float8 dtypes
 * (`f8e4m3fn`, `f8e5m2`) are a `Uint8Array` of raw bits the same way. The complex dtypes
 * (`c64`, `c128`) are a `Float32Array` / `Float64Array` of interleaved real and imaginary
 * parts: two entries per element (`lanes(dtype)`).
 *
 * Without `strides`, `data` holds the elements in row-major order and
 * `data.length == product(shape) * lanes(dtype)`. A received tensor may carry `strides` (in
 * elements, as on the wire); `data` then holds the whole strided span. `contiguous()` makes
 * a row-major copy.
 *
 * Tensors received from a server are views into the received message's buffer (no copy);
 * tensors sent to a server are read straight from `data` (no copy): do not modify `data`
 * while the call that sends it is in flight.
 */
export declare class Tensor<D extends DType = DType> {
    readonly dtype: D;
    readonly shape: number[];
    readonly data: TypedArrayFor[D];
    readonly strides: number[] | undefined;
    /**
     * Checks that `data` is the typed array of `dtype` and holds exactly `product(shape)`
     * elements (or, with `strides`, at least the strided span); an element is
     * `lanes(dtype)` entries of `data`.
     */
    constructor(dtype: D, shape: readonly number[], data: TypedArrayFor[D], strides?: readonly number[]);
    /**
     * A tensor from elements. `values` may be a typed array (its dtype is inferred unless
     * given: Uint8Array is `u8`, Uint16Array is `u16`; pass `"bool"`, `"f16"`, `"bf16"`,
     * `"f8e4m3fn"`, `"f8e5m2"`, `"c64"` or `"c128"` to reinterpret) or a plain array: numbers
     * (default dtype `f32`; with `"f16"`/`"bf16"`/`"f8e4m3fn"`/`"f8e5m2"` they are converted
     * to raw bits; with `"c64"`/`"c128"` they are interleaved real and imaginary parts),
     * bigints (default `i64`) or booleans (default `bool`). A typed array of the right class
     * is used as is (not copied); anything else is converted. `shape` defaults to
     * `[values.length / lanes(dtype)]`.
     */
    static from<D extends DType = DType>(values: TensorInput, shape?: readonly number[], dtype?: D): Tensor<D>;
    /** A tensor of zeros. */
    static zeros<D extends DType>(dtype: D, shape: readonly number[]): Tensor<D>;
    /** A 0-d tensor (shape `[]`) holding one value (complex dtypes: `value + 0i`). */
    static scalar<D extends DType = "f64">(value: number | bigint | boolean, dtype?: D): Tensor<D>;
    /** Number of elements (`product(shape)`, 1 for `[]`). */
    get numel(): number;
    /** Bytes of `data`. */
    get nbytes(): number;
    /** Whether the elements are in row-major order in `data` (no strides, or row-major ones). */
    get isContiguous(): boolean;
    /** The bytes of `data` (a view, no copy). */
    bytes(): Uint8Array;
    /** A row-major tensor with the same elements: `this` if it is one already, else a copy. */
    contiguous(): Tensor<D>;
    /**
     * The elements as plain numbers in row-major order: f16/bf16/float8 bits are decoded,
     * bool is 0/1, 64-bit integers are converted with `Number()` (exact up to 2^53), complex
     * elements are two numbers each (real, imaginary).
     */
    toNumbers(): number[];
    /** Same dtype, shape and elements (compares element bytes of the row-major forms). */
    equals(other: Tensor): boolean;
    toString(): string;
}
