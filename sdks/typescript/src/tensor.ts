import {
  type DType,
  type TypedArray,
  type TypedArrayFor,
  arrayType,
  bf16ToNumber,
  dtypeOf,
  f16ToNumber,
  f8e4m3fnToNumber,
  f8e5m2ToNumber,
  holds,
  isDType,
  lanes,
  numberToBf16,
  numberToF16,
  numberToF8e4m3fn,
  numberToF8e5m2,
} from "./dtype.js";

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
export class Tensor<D extends DType = DType> {
  readonly dtype: D;
  readonly shape: number[];
  readonly data: TypedArrayFor[D];
  readonly strides: number[] | undefined;

  /**
   * Checks that `data` is the typed array of `dtype` and holds exactly `product(shape)`
   * elements (or, with `strides`, at least the strided span); an element is
   * `lanes(dtype)` entries of `data`.
   */
  constructor(dtype: D, shape: readonly number[], data: TypedArrayFor[D], strides?: readonly number[]) {
    if (!isDType(dtype)) throw new TypeError(`unknown dtype ${JSON.stringify(dtype)}`);
    if (!holds(dtype, data)) {
      throw new TypeError(`a ${dtype} tensor needs a ${arrayType(dtype).name}, got ${describe(data)}`);
    }
    const dims = checkDims(shape, "shape");
    const n = numelOf(dims);
    const k = lanes(dtype);
    if (strides === undefined) {
      if (data.length !== n * k) {
        const what = k === 1 ? `${n} elements` : `${n * k} numbers (${n} elements)`;
        throw new RangeError(`shape [${dims.join(",")}] needs ${what}, the ${dtype} data has ${data.length}`);
      }
    } else {
      const st = checkDims(strides, "strides");
      if (st.length !== dims.length) throw new RangeError("strides need one entry per dimension");
      const span = stridedSpan(dims, st);
      if (span * k > data.length) {
        throw new RangeError(`shape [${dims}] with strides [${st}] spans ${span} elements, the data has ${data.length / k}`);
      }
      this.strides = st;
    }
    this.dtype = dtype;
    this.shape = dims;
    this.data = data;
    if (strides === undefined) this.strides = undefined;
  }

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
  static from<D extends DType = DType>(values: TensorInput, shape?: readonly number[], dtype?: D): Tensor<D> {
    const dt = (dtype ?? inferDType(values)) as D;
    if (!isDType(dt)) throw new TypeError(`unknown dtype ${JSON.stringify(dt)}`);
    const k = lanes(dt);
    if (values.length % k !== 0) {
      throw new RangeError(`${dt} takes ${k} numbers per element (real, imaginary), got ${values.length}`);
    }
    const dims = shape ?? [values.length / k];
    let data: TypedArrayFor[D];
    if (holds(dt, values)) {
      data = values as TypedArrayFor[D];
    } else {
      data = convert(dt, values) as TypedArrayFor[D];
    }
    return new Tensor(dt, dims, data);
  }

  /** A tensor of zeros. */
  static zeros<D extends DType>(dtype: D, shape: readonly number[]): Tensor<D> {
    const dims = checkDims(shape, "shape");
    return new Tensor(dtype, dims, new (arrayType(dtype))(numelOf(dims) * lanes(dtype)));
  }

  /** A 0-d tensor (shape `[]`) holding one value (complex dtypes: `value + 0i`). */
  static scalar<D extends DType = "f64">(value: number | bigint | boolean, dtype?: D): Tensor<D> {
    const dt = (dtype ?? (typeof value === "bigint" ? "i64" : typeof value === "boolean" ? "bool" : "f64")) as D;
    const values = lanes(dt) === 2 ? [value, 0] : [value];
    return Tensor.from(convert(dt, values as ArrayLike<number>), [], dt);
  }

  /** Number of elements (`product(shape)`, 1 for `[]`). */
  get numel(): number {
    return numelOf(this.shape);
  }

  /** Bytes of `data`. */
  get nbytes(): number {
    return this.data.byteLength;
  }

  /** Whether the elements are in row-major order in `data` (no strides, or row-major ones). */
  get isContiguous(): boolean {
    if (this.strides === undefined) return true;
    let expect = 1;
    for (let i = this.shape.length - 1; i >= 0; i--) {
      if (this.shape[i] !== 1 && this.strides[i] !== expect) return false;
      expect *= this.shape[i]!;
    }
    return this.data.length === this.numel;
  }

  /** The bytes of `data` (a view, no copy). */
  bytes(): Uint8Array {
    return new Uint8Array(this.data.buffer, this.data.byteOffset, this.data.byteLength);
  }

  /** A row-major tensor with the same elements: `this` if it is one already, else a copy. */
  contiguous(): Tensor<D> {
    if (this.strides === undefined) return this;
    const n = this.numel;
    const l = lanes(this.dtype);
    const out = new (arrayType(this.dtype))(n * l) as TypedArray;
    const src = this.data as TypedArray;
    const nd = this.shape.length;
    const idx = new Array<number>(nd).fill(0);
    for (let k = 0; k < n; k++) {
      let off = 0;
      for (let d = 0; d < nd; d++) off += idx[d]! * this.strides[d]!;
      for (let j = 0; j < l; j++) (out as Float64Array)[k * l + j] = (src as Float64Array)[off * l + j]!;
      for (let d = nd - 1; d >= 0; d--) {
        if (++idx[d]! < this.shape[d]!) break;
        idx[d] = 0;
      }
    }
    return new Tensor(this.dtype, this.shape, out as TypedArrayFor[D]);
  }

  /**
   * The elements as plain numbers in row-major order: f16/bf16/float8 bits are decoded,
   * bool is 0/1, 64-bit integers are converted with `Number()` (exact up to 2^53), complex
   * elements are two numbers each (real, imaginary).
   */
  toNumbers(): number[] {
    const t = this.contiguous();
    const out = new Array<number>(t.data.length);
    const d = t.data as TypedArray;
    const decode =
      t.dtype === "f16"
        ? f16ToNumber
        : t.dtype === "bf16"
          ? bf16ToNumber
          : t.dtype === "f8e4m3fn"
            ? f8e4m3fnToNumber
            : t.dtype === "f8e5m2"
              ? f8e5m2ToNumber
              : undefined;
    if (decode !== undefined) for (let i = 0; i < out.length; i++) out[i] = decode(d[i] as number);
    else for (let i = 0; i < out.length; i++) out[i] = Number(d[i]);
    return out;
  }

  /** Same dtype, shape and elements (compares element bytes of the row-major forms). */
  equals(other: Tensor): boolean {
    if (other.dtype !== this.dtype || other.shape.length !== this.shape.length) return false;
    if (this.shape.some((d, i) => d !== other.shape[i])) return false;
    return Buffer.from(this.contiguous().bytes()).equals(other.contiguous().bytes());
  }

  toString(): string {
    return `Tensor(${this.dtype}[${this.shape.join(",")}])`;
  }
}

function describe(v: unknown): string {
  if (v === null || v === undefined) return String(v);
  if (typeof v === "object") return (v as object).constructor?.name ?? "object";
  return typeof v;
}

function checkDims(dims: readonly number[], what: string): number[] {
  if (!Array.isArray(dims)) throw new TypeError(`${what} must be an array of integers`);
  if (dims.length > 64) throw new RangeError(`${what} has ${dims.length} dimensions; at most 64 are allowed`);
  for (const d of dims) {
    if (!Number.isSafeInteger(d) || d < 0) throw new RangeError(`${what} entries must be integers >= 0, got ${d}`);
  }
  return [...dims];
}

function numelOf(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  if (!Number.isSafeInteger(n)) throw new RangeError(`shape [${shape}] has more than 2^53 elements`);
  return n;
}

function stridedSpan(shape: readonly number[], strides: readonly number[]): number {
  if (shape.some((d) => d === 0)) return 0;
  let last = 0;
  for (let i = 0; i < shape.length; i++) last += (shape[i]! - 1) * strides[i]!;
  if (!Number.isSafeInteger(last + 1)) throw new RangeError("strided span is above 2^53");
  return last + 1;
}

function inferDType(values: TensorInput): DType {
  if (ArrayBuffer.isView(values)) return dtypeOf(values as TypedArray);
  if (values.length === 0) return "f32";
  const first = values[0];
  if (typeof first === "bigint") return "i64";
  if (typeof first === "boolean") return "bool";
  return "f32";
}

function convert(dtype: DType, values: TensorInput): TypedArray {
  const n = values.length;
  const out = new (arrayType(dtype))(n) as TypedArray;
  const big = dtype === "i64" || dtype === "u64";
  for (let i = 0; i < n; i++) {
    const v = values[i] as number | bigint | boolean;
    if (big) {
      (out as BigInt64Array)[i] = typeof v === "bigint" ? v : BigInt(typeof v === "boolean" ? Number(v) : v);
    } else {
      const x = typeof v === "bigint" || typeof v === "boolean" ? Number(v) : v;
      if (dtype === "f16") (out as Uint16Array)[i] = numberToF16(x);
      else if (dtype === "bf16") (out as Uint16Array)[i] = numberToBf16(x);
      else if (dtype === "f8e4m3fn") (out as Uint8Array)[i] = numberToF8e4m3fn(x);
      else if (dtype === "f8e5m2") (out as Uint8Array)[i] = numberToF8e5m2(x);
      else if (dtype === "bool") (out as Uint8Array)[i] = x ? 1 : 0;
      else (out as Float64Array)[i] = x;
    }
  }
  return out;
}
