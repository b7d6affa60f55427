/**
 * ferry-client: a TypeScript client for ferry servers (JSON-RPC with tensors over unix
 * sockets, inline channel). See README.md.
 */
export { Client, type BatchCall, type BatchResult, type CallOptions, type ConnectOptions, type TaskStatus } from "./client.js";
export { Tensor, type TensorInput } from "./tensor.js";
export type { TensorMap } from "./refs.js";
export { TensorRef } from "./refs.js";
export { type KeepOptions, fetch, free, keep, listRefs, publish } from "./remote.js";
export { DTYPES, type DType, type TypedArray, type TypedArrayFor, arrayType, bf16ToNumber, dtypeOf, f16ToNumber, f8e4m3fnToNumber, f8e5m2ToNumber, isDType, itemSize, lanes, numberToBf16, numberToF16, numberToF8e4m3fn, numberToF8e5m2, } from "./dtype.js";
export { ConnectionClosedError, type ErrorObject, FerryError, LimitError, ProtocolError, RefusedError, RpcError, TimeoutError, } from "./errors.js";
export { CancelledError, ERRORS, ErrorCode, ForbiddenError, InternalError, InvalidParamsError, InvalidRequestError, LimitExceededError, MethodNotFoundError, NotFoundError, ParseError, type RpcErrorClass, ServerError, ServerTimeoutError, TaskNotFoundError, TaskPendingError, TensorError, UnauthorizedError, UnavailableError, errorFromCode, } from "./rpc_errors.js";
export { FEATURES, Kind, MAX_DIMS, PROTOCOL, PROTOCOL_VERSION } from "./constants.js";
export { type Limits, DEFAULT_LIMITS, VERSION } from "./frame.js";
export type { Welcome } from "./connection.js";
export { parseAddress } from "./socket.js";
