/**
 * ferry-client: a TypeScript client for ferry servers (JSON-RPC with tensors over unix
 * sockets, inline channel). See README.md.
 */
export { Client } from "./client.js";
export { Tensor } from "./tensor.js";
export { TensorRef } from "./refs.js";
export { fetch, free, keep, listRefs, publish } from "./remote.js";
export { DTYPES, arrayType, bf16ToNumber, dtypeOf, f16ToNumber, f8e4m3fnToNumber, f8e5m2ToNumber, isDType, itemSize, lanes, numberToBf16, numberToF16, numberToF8e4m3fn, numberToF8e5m2, } from "./dtype.js";
export { ConnectionClosedError, FerryError, LimitError, ProtocolError, RefusedError, RpcError, TimeoutError, } from "./errors.js";
export { CancelledError, ERRORS, ErrorCode, ForbiddenError, InternalError, InvalidParamsError, InvalidRequestError, LimitExceededError, MethodNotFoundError, NotFoundError, ParseError, ServerError, ServerTimeoutError, TaskNotFoundError, TaskPendingError, TensorError, UnauthorizedError, UnavailableError, errorFromCode, } from "./rpc_errors.js";
export { FEATURES, Kind, MAX_DIMS, PROTOCOL, PROTOCOL_VERSION } from "./constants.js";
export { DEFAULT_LIMITS, VERSION } from "./frame.js";
export { parseAddress } from "./socket.js";
