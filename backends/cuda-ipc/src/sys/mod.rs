//! The only unsafe code of ferry-cuda-ipc: [`CudaDriver`], the real [`Driver`], over the
//! CUDA driver API as cudarc loads it at run time (`cudarc::driver::sys`), behind a safe
//! interface.
//!
//! - **Loading**: nothing touches the driver before [`Driver::probe`] succeeded. The probe
//!   first asks cudarc whether `libcuda` can be loaded at all
//!   (`sys::is_culib_present`; cudarc panics on a missing library otherwise), then resolves
//!   every entry point this module calls from cudarc's library handle (`sys::culib`). A
//!   missing symbol (an old driver) is a "not viable" reason, never cudarc's panic. The
//!   entry points are typed with cudarc's `sys` types, but return `CUresult` as a plain
//!   `c_int`, so a result code newer than the bindings cannot become an invalid enum value.
//! - **Context**: every call runs in the device's primary context (the one the runtime API,
//!   hence PyTorch and CuPy, uses), retained on first use and kept for the life of the
//!   process; streams are the legacy default stream of that context.
//! - **Checked handles**: allocations, opened mappings and events live in tables here.
//!   Frees, closes and event operations accept only what these tables hold; copies accept
//!   only ranges inside a known allocation or mapping, or inside a range the driver itself
//!   reports (`cuMemGetAddressRange`) for memory allocated elsewhere in the process. A wrong
//!   value from safe code is an error, never a call with a dangling handle.
//! - **IPC rules**: a handle this process exported is never opened here; a handle opened
//!   twice is mapped once and counted.
//!
//! One mutex guards the tables and the calls (which also keeps `cuCtxSetCurrent` and the
//! call after it together on one thread).
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys as cu;

use crate::descriptor::format_uuid;
use crate::driver::{DeviceInfo, Driver, DriverError, EventId, HANDLE_BYTES, IpcHandle};

/// Environment variable that turns the channel off (`1`): it then reports not viable.
pub const DISABLE_ENV: &str = "FERRY_CUDA_IPC_DISABLE";

macro_rules! api {
    ($($name:ident ( $($arg:ty),* );)*) => {
        /// The driver entry points this module calls, resolved once.
        #[allow(non_snake_case)]
        struct Api { $($name: unsafe extern "C" fn($($arg),*) -> c_int,)* }

        impl Api {
            /// Resolves every entry point from cudarc's driver library handle.
            fn load() -> Result<Api, String> {
                // SAFETY: called only after `is_culib_present()` returned true, so cudarc's
                // loader finds the library (it panics only when no candidate loads; the probe
                // also runs under catch_unwind). The handle is kept in a static for the life
                // of the process.
                let lib = unsafe { cu::culib() };
                Ok(Api { $($name: {
                    // SAFETY: `$name` is a CUDA driver API function whose C signature (cuda.h)
                    // is exactly this one (cudarc's own bindings declare the same arguments;
                    // `CUresult` is a C enum, passed as `int`). The library is never unloaded,
                    // so the pointer stays valid.
                    let sym = unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> c_int>(stringify!($name).as_bytes()) };
                    *sym.map_err(|e| format!(
                        "the CUDA driver has no {} ({e}); ferry needs a driver for CUDA 11.4 or newer",
                        stringify!($name)))?
                },)* })
            }
        }
    };
}

api! {
    cuInit(c_uint);
    cuDriverGetVersion(*mut c_int);
    cuDeviceGetCount(*mut c_int);
    cuDeviceGet(*mut cu::CUdevice, c_int);
    cuDeviceGetAttribute(*mut c_int, c_int, cu::CUdevice);
    cuDeviceGetUuid_v2(*mut cu::CUuuid, cu::CUdevice);
    cuDeviceGetName(*mut c_char, c_int, cu::CUdevice);
    cuDevicePrimaryCtxRetain(*mut cu::CUcontext, cu::CUdevice);
    cuCtxGetCurrent(*mut cu::CUcontext);
    cuCtxSetCurrent(cu::CUcontext);
    cuMemAlloc_v2(*mut cu::CUdeviceptr, usize);
    cuMemFree_v2(cu::CUdeviceptr);
    cuMemGetAddressRange_v2(*mut cu::CUdeviceptr, *mut usize, cu::CUdeviceptr);
    cuIpcGetMemHandle(*mut cu::CUipcMemHandle, cu::CUdeviceptr);
    cuIpcOpenMemHandle_v2(*mut cu::CUdeviceptr, cu::CUipcMemHandle, c_uint);
    cuIpcCloseMemHandle(cu::CUdeviceptr);
    cuEventCreate(*mut cu::CUevent, c_uint);
    cuEventDestroy_v2(cu::CUevent);
    cuEventRecord(cu::CUevent, cu::CUstream);
    cuEventSynchronize(cu::CUevent);
    cuIpcGetEventHandle(*mut cu::CUipcEventHandle, cu::CUevent);
    cuIpcOpenEventHandle(*mut cu::CUevent, cu::CUipcEventHandle);
    cuStreamWaitEvent(cu::CUstream, cu::CUevent, c_uint);
    cuMemcpyDtoDAsync_v2(cu::CUdeviceptr, cu::CUdeviceptr, usize, cu::CUstream);
    cuMemcpyHtoD_v2(cu::CUdeviceptr, *const c_void, usize);
    cuMemcpyDtoH_v2(*mut c_void, cu::CUdeviceptr, usize);
    cuGetErrorName(c_int, *mut *const c_char);
}

/// The legacy default stream (a null `CUstream` for the non-`_ptsz` entry points).
const STREAM: cu::CUstream = std::ptr::null_mut();
const CUDA_SUCCESS: c_int = 0;
const ATTR_COMPUTE_MODE: c_int = cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE as c_int;
const ATTR_UNIFIED_ADDRESSING: c_int = cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING as c_int;
const COMPUTE_PROHIBITED: c_int = cu::CUcomputemode::CU_COMPUTEMODE_PROHIBITED as c_int;
const EVENT_FLAGS: c_uint =
    cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint | cu::CUevent_flags::CU_EVENT_INTERPROCESS as c_uint;
const IPC_LAZY_PEER_ACCESS: c_uint = cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;

struct Probed {
    api: Api,
    devices: Vec<DeviceInfo>,
    /// `CUdevice` of each usable device, by ordinal.
    cudevs: HashMap<u32, cu::CUdevice>,
}

#[derive(Default)]
struct State {
    /// Retained primary contexts (`CUcontext` as an address), by ordinal.
    ctxs: HashMap<u32, usize>,
    /// Allocations of this process: base -> (device, size).
    own: BTreeMap<u64, (u32, u64)>,
    /// Handles this process exported.
    own_handles: HashSet<IpcHandle>,
    /// Opened mappings: handle -> (device, base, size, count).
    imports: HashMap<IpcHandle, (u32, u64, u64, u32)>,
    import_ptrs: BTreeMap<u64, IpcHandle>,
    /// Events: id -> (device, `CUevent` as an address).
    events: HashMap<u64, (u32, usize)>,
    own_event_handles: HashSet<IpcHandle>,
    next_event: u64,
}

/// A driver call in progress: the tables locked and the device's context current; drop
/// restores the thread's previous context.
struct Entered<'a> {
    api: &'a Api,
    st: MutexGuard<'a, State>,
    restore: Option<usize>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            // SAFETY: `prev` was this thread's current context when the call began (a
            // context the caller holds, or null for none); the call did not destroy it.
            let _ = unsafe { (self.api.cuCtxSetCurrent)(prev as cu::CUcontext) };
        }
    }
}

/// The real CUDA driver. One per process ([`CudaDriver::shared`]).
pub struct CudaDriver {
    probe: OnceLock<Result<Probed, String>>,
    st: Mutex<State>,
}

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDriver").finish_non_exhaustive()
    }
}

impl CudaDriver {
    /// The process's driver (loads nothing until [`Driver::probe`]).
    pub fn shared() -> Arc<CudaDriver> {
        static D: OnceLock<Arc<CudaDriver>> = OnceLock::new();
        D.get_or_init(|| Arc::new(CudaDriver { probe: OnceLock::new(), st: Mutex::default() })).clone()
    }

    fn probed(&self) -> &Result<Probed, String> {
        self.probe.get_or_init(|| {
            std::panic::catch_unwind(probe_driver).unwrap_or_else(|p| {
                let msg =
                    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                Err(format!("loading the CUDA driver failed: {}", msg.unwrap_or_else(|| "panic".into())))
            })
        })
    }

    /// The probed driver, the state, and `dev`'s primary context made current on this
    /// thread until the returned guard drops (then the caller's context is restored).
    fn enter(&self, op: &'static str, dev: u32) -> Result<Entered<'_>, DriverError> {
        let p = self.probed().as_ref().map_err(|why| DriverError::refused(op, why.clone()))?;
        let cudev = *p.cudevs.get(&dev).ok_or_else(|| DriverError::refused(op, format!("no usable cuda:{dev}")))?;
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = match st.ctxs.get(&dev) {
            Some(&c) => c as cu::CUcontext,
            None => {
                let mut c: cu::CUcontext = std::ptr::null_mut();
                // SAFETY: `c` is a valid out-pointer and `cudev` came from cuDeviceGet.
                check(&p.api, "cuDevicePrimaryCtxRetain", unsafe { (p.api.cuDevicePrimaryCtxRetain)(&mut c, cudev) })?;
                st.ctxs.insert(dev, c as usize);
                c
            }
        };
        let mut prev: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; only reads this thread's current context.
        check(&p.api, "cuCtxGetCurrent", unsafe { (p.api.cuCtxGetCurrent)(&mut prev) })?;
        if prev != ctx {
            // SAFETY: `ctx` is a primary context retained above (never released).
            check(&p.api, "cuCtxSetCurrent", unsafe { (p.api.cuCtxSetCurrent)(ctx) })?;
        }
        Ok(Entered { api: &p.api, st, restore: (prev != ctx).then_some(prev as usize) })
    }

    /// Whether `[ptr, ptr + len)` is device memory: a known allocation or mapping, or a
    /// range the driver reports (memory allocated elsewhere in this process).
    fn check_range(api: &Api, st: &State, op: &'static str, ptr: u64, len: u64) -> Result<(), DriverError> {
        let end = ptr.checked_add(len).ok_or_else(|| DriverError::refused(op, "range overflows"))?;
        let own = st.own.range(..=ptr).next_back().map(|(&b, &(_, s))| (b, s));
        let imported =
            st.import_ptrs.range(..=ptr).next_back().and_then(|(_, h)| st.imports.get(h)).map(|i| (i.1, i.2));
        for (base, size) in [own, imported].into_iter().flatten() {
            if ptr >= base && end <= base + size {
                return Ok(());
            }
        }
        let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
        // SAFETY: both out-pointers are valid; the call only queries the driver's tables.
        let r = unsafe { (api.cuMemGetAddressRange_v2)(&mut base, &mut size, ptr) };
        if r != CUDA_SUCCESS {
            return Err(DriverError::refused(op, format!("{ptr:#x} is not device memory ({})", error_name(api, r))));
        }
        if end > base + size as u64 {
            return Err(DriverError::refused(op, format!("{ptr:#x}+{len} runs past its allocation")));
        }
        Ok(())
    }

    fn event(st: &State, op: &'static str, ev: EventId) -> Result<(u32, cu::CUevent), DriverError> {
        st.events
            .get(&ev.0)
            .map(|&(dev, raw)| (dev, raw as cu::CUevent))
            .ok_or_else(|| DriverError::refused(op, format!("unknown event {}", ev.0)))
    }
}

fn error_name(api: &Api, r: c_int) -> String {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: `p` is a valid out-pointer; on success the driver points it at a static string.
    let ok = unsafe { (api.cuGetErrorName)(r, &mut p) } == CUDA_SUCCESS && !p.is_null();
    if ok {
        // SAFETY: cuGetErrorName returned a NUL-terminated static string.
        let name = unsafe { std::ffi::CStr::from_ptr(p) };
        format!("{} ({r})", name.to_string_lossy())
    } else {
        format!("CUresult {r}")
    }
}

fn check(api: &Api, op: &'static str, r: c_int) -> Result<(), DriverError> {
    if r == CUDA_SUCCESS { Ok(()) } else { Err(DriverError { op, code: Some(r), detail: error_name(api, r) }) }
}

fn to_handle(reserved: &[c_char; HANDLE_BYTES]) -> IpcHandle {
    IpcHandle(reserved.map(|b| b as u8))
}

fn from_handle(h: &IpcHandle) -> [c_char; HANDLE_BYTES] {
    h.0.map(|b| b as c_char)
}

fn probe_driver() -> Result<Probed, String> {
    if std::env::var_os(DISABLE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return Err(format!("disabled by {DISABLE_ENV}"));
    }
    if !cfg!(target_os = "linux") {
        return Err("CUDA IPC (cuIpc*) works on Linux only".into());
    }
    if std::fs::read_to_string("/proc/version").is_ok_and(|v| v.to_ascii_lowercase().contains("microsoft")) {
        return Err("CUDA IPC is not supported under WSL".into());
    }
    // SAFETY: only tries to dlopen the driver library's names and closes what it opened.
    if !unsafe { cu::is_culib_present() } {
        return Err("no CUDA driver: libcuda.so could not be loaded (no NVIDIA driver installed here)".into());
    }
    let api = Api::load()?;
    // SAFETY: cuInit takes flags by value (0 is the only valid value).
    check(&api, "cuInit", unsafe { (api.cuInit)(0) }).map_err(|e| e.to_string())?;
    let mut version = 0;
    // SAFETY: valid out-pointer.
    check(&api, "cuDriverGetVersion", unsafe { (api.cuDriverGetVersion)(&mut version) }).map_err(|e| e.to_string())?;
    let mut count = 0;
    // SAFETY: valid out-pointer.
    check(&api, "cuDeviceGetCount", unsafe { (api.cuDeviceGetCount)(&mut count) }).map_err(|e| e.to_string())?;
    if count <= 0 {
        let cvd =
            std::env::var("CUDA_VISIBLE_DEVICES").map(|v| format!(" (CUDA_VISIBLE_DEVICES={v:?})")).unwrap_or_default();
        return Err(format!("no CUDA device is visible{cvd}"));
    }
    let (mut devices, mut cudevs, mut skipped) = (Vec::new(), HashMap::new(), Vec::new());
    for i in 0..count {
        let mut d: cu::CUdevice = 0;
        // SAFETY: valid out-pointer; 0 <= i < count.
        check(&api, "cuDeviceGet", unsafe { (api.cuDeviceGet)(&mut d, i) }).map_err(|e| e.to_string())?;
        let attr = |a: c_int| -> Result<c_int, String> {
            let mut v = 0;
            // SAFETY: valid out-pointer; `a` is a device attribute of cuda.h; `d` is a device.
            check(&api, "cuDeviceGetAttribute", unsafe { (api.cuDeviceGetAttribute)(&mut v, a, d) })
                .map(|()| v)
                .map_err(|e| e.to_string())
        };
        if attr(ATTR_COMPUTE_MODE)? == COMPUTE_PROHIBITED {
            skipped.push(format!("cuda:{i} is in compute mode prohibited"));
            continue;
        }
        if attr(ATTR_UNIFIED_ADDRESSING)? != 1 {
            skipped.push(format!("cuda:{i} has no unified addressing"));
            continue;
        }
        let mut uuid = cu::CUuuid { bytes: [0; 16] };
        // SAFETY: valid out-pointer to a CUuuid.
        check(&api, "cuDeviceGetUuid_v2", unsafe { (api.cuDeviceGetUuid_v2)(&mut uuid, d) })
            .map_err(|e| e.to_string())?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 chars and the driver writes a NUL-terminated name into it.
        let named = unsafe { (api.cuDeviceGetName)(name.as_mut_ptr(), name.len() as c_int, d) } == CUDA_SUCCESS;
        let name = if named {
            let bytes: Vec<u8> = name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            String::new()
        };
        devices.push(DeviceInfo { ordinal: i as u32, uuid: format_uuid("GPU", &uuid.bytes.map(|b| b as u8)), name });
        cudevs.insert(i as u32, d);
    }
    if devices.is_empty() {
        return Err(format!("no CUDA device can be used for IPC: {}", skipped.join("; ")));
    }
    tracing::debug!(driver = version, devices = ?devices, skipped = ?skipped, "cuda-ipc: driver ready");
    Ok(Probed { api, devices, cudevs })
}

impl Driver for CudaDriver {
    fn process_id(&self) -> u32 {
        std::process::id()
    }

    fn probe(&self) -> Result<Vec<DeviceInfo>, String> {
        self.probed().as_ref().map(|p| p.devices.clone()).map_err(Clone::clone)
    }

    fn alloc(&self, dev: u32, len: u64) -> Result<u64, DriverError> {
        const OP: &str = "cuMemAlloc";
        let n = usize::try_from(len).ok().filter(|&n| n > 0).ok_or_else(|| DriverError::refused(OP, "bad length"))?;
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the device's context is current.
        check(api, OP, unsafe { (api.cuMemAlloc_v2)(&mut p, n) })?;
        st.own.insert(p, (dev, len));
        Ok(p)
    }

    fn free(&self, dev: u32, ptr: u64) -> Result<(), DriverError> {
        const OP: &str = "cuMemFree";
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        if st.own.get(&ptr).map(|o| o.0) != Some(dev) {
            return Err(DriverError::refused(
                OP,
                format!("{ptr:#x} is not an allocation of this channel on cuda:{dev}"),
            ));
        }
        // SAFETY: `ptr` is the base of a live allocation made by cuMemAlloc on this device.
        check(api, OP, unsafe { (api.cuMemFree_v2)(ptr) })?;
        st.own.remove(&ptr);
        Ok(())
    }

    fn mem_handle(&self, dev: u32, ptr: u64) -> Result<IpcHandle, DriverError> {
        const OP: &str = "cuIpcGetMemHandle";
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        if st.own.get(&ptr).map(|o| o.0) != Some(dev) {
            return Err(DriverError::refused(OP, format!("{ptr:#x} is not an allocation of this channel")));
        }
        let mut h = cu::CUipcMemHandle { reserved: [0; HANDLE_BYTES] };
        // SAFETY: valid out-pointer; `ptr` is the base of a live cuMemAlloc allocation.
        check(api, OP, unsafe { (api.cuIpcGetMemHandle)(&mut h, ptr) })?;
        let h = to_handle(&h.reserved);
        st.own_handles.insert(h);
        Ok(h)
    }

    fn open_mem_handle(&self, dev: u32, handle: &IpcHandle) -> Result<(u64, u64), DriverError> {
        const OP: &str = "cuIpcOpenMemHandle";
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        if st.own_handles.contains(handle) {
            return Err(DriverError::refused(OP, "the handle was exported by this process; it is never opened here"));
        }
        if let Some(i) = st.imports.get_mut(handle) {
            if i.0 != dev {
                return Err(DriverError::refused(OP, format!("the handle is already open on cuda:{}", i.0)));
            }
            i.3 += 1;
            return Ok((i.1, i.2));
        }
        let mut p: cu::CUdeviceptr = 0;
        let raw = cu::CUipcMemHandle { reserved: from_handle(handle) };
        // SAFETY: valid out-pointer; the handle is passed by value and the driver validates it.
        check(api, OP, unsafe { (api.cuIpcOpenMemHandle_v2)(&mut p, raw, IPC_LAZY_PEER_ACCESS) })?;
        let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers; `p` was just mapped.
        let r = unsafe { (api.cuMemGetAddressRange_v2)(&mut base, &mut size, p) };
        if r != CUDA_SUCCESS || base != p {
            // SAFETY: `p` was returned by cuIpcOpenMemHandle above and is closed once.
            let _ = unsafe { (api.cuIpcCloseMemHandle)(p) };
            return Err(DriverError { op: "cuMemGetAddressRange", code: Some(r), detail: error_name(api, r) });
        }
        st.imports.insert(*handle, (dev, p, size as u64, 1));
        st.import_ptrs.insert(p, *handle);
        Ok((p, size as u64))
    }

    fn close_mem_handle(&self, dev: u32, ptr: u64) -> Result<(), DriverError> {
        const OP: &str = "cuIpcCloseMemHandle";
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        let h = *st.import_ptrs.get(&ptr).ok_or_else(|| DriverError::refused(OP, format!("{ptr:#x} is not open")))?;
        let Some(i) = st.imports.get_mut(&h) else { return Err(DriverError::refused(OP, "inconsistent table")) };
        if i.0 != dev {
            return Err(DriverError::refused(OP, format!("{ptr:#x} is open on cuda:{}", i.0)));
        }
        i.3 -= 1;
        if i.3 > 0 {
            return Ok(());
        }
        st.imports.remove(&h);
        st.import_ptrs.remove(&ptr);
        // SAFETY: `ptr` came from cuIpcOpenMemHandle and its last count is closed here, once.
        check(api, OP, unsafe { (api.cuIpcCloseMemHandle)(ptr) })
    }

    fn event_create(&self, dev: u32) -> Result<EventId, DriverError> {
        const OP: &str = "cuEventCreate";
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; interprocess events must disable timing, as the flags do.
        check(api, OP, unsafe { (api.cuEventCreate)(&mut e, EVENT_FLAGS) })?;
        st.next_event += 1;
        let id = st.next_event;
        st.events.insert(id, (dev, e as usize));
        Ok(EventId(id))
    }

    fn event_handle(&self, dev: u32, ev: EventId) -> Result<IpcHandle, DriverError> {
        const OP: &str = "cuIpcGetEventHandle";
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        let (edev, e) = Self::event(st, OP, ev)?;
        if edev != dev {
            return Err(DriverError::refused(OP, "the event is on another device"));
        }
        let mut h = cu::CUipcEventHandle { reserved: [0; HANDLE_BYTES] };
        // SAFETY: valid out-pointer; `e` is a live interprocess event from the table.
        check(api, OP, unsafe { (api.cuIpcGetEventHandle)(&mut h, e) })?;
        let h = to_handle(&h.reserved);
        st.own_event_handles.insert(h);
        Ok(h)
    }

    fn event_open(&self, dev: u32, handle: &IpcHandle) -> Result<EventId, DriverError> {
        const OP: &str = "cuIpcOpenEventHandle";
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        if st.own_event_handles.contains(handle) {
            return Err(DriverError::refused(OP, "the event handle was exported by this process"));
        }
        let mut e: cu::CUevent = std::ptr::null_mut();
        let raw = cu::CUipcEventHandle { reserved: from_handle(handle) };
        // SAFETY: valid out-pointer; the handle is passed by value and the driver validates it.
        check(api, OP, unsafe { (api.cuIpcOpenEventHandle)(&mut e, raw) })?;
        st.next_event += 1;
        let id = st.next_event;
        st.events.insert(id, (dev, e as usize));
        Ok(EventId(id))
    }

    fn event_destroy(&self, dev: u32, ev: EventId) -> Result<(), DriverError> {
        const OP: &str = "cuEventDestroy";
        let mut g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &mut g.st);
        let (_, e) = Self::event(st, OP, ev)?;
        st.events.remove(&ev.0);
        // SAFETY: `e` is a live event from the table, destroyed once (removed above).
        check(api, OP, unsafe { (api.cuEventDestroy_v2)(e) })
    }

    fn event_record(&self, dev: u32, ev: EventId) -> Result<(), DriverError> {
        const OP: &str = "cuEventRecord";
        let g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &g.st);
        let (edev, e) = Self::event(st, OP, ev)?;
        if edev != dev {
            return Err(DriverError::refused(OP, "the event is on another device"));
        }
        // SAFETY: `e` is a live event of this device's context, which is current.
        check(api, OP, unsafe { (api.cuEventRecord)(e, STREAM) })
    }

    fn event_sync(&self, dev: u32, ev: EventId) -> Result<(), DriverError> {
        const OP: &str = "cuEventSynchronize";
        let g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &g.st);
        let (_, e) = Self::event(st, OP, ev)?;
        // SAFETY: `e` is a live event from the table.
        check(api, OP, unsafe { (api.cuEventSynchronize)(e) })
    }

    fn wait_event(&self, dev: u32, ev: EventId) -> Result<(), DriverError> {
        const OP: &str = "cuStreamWaitEvent";
        let g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &g.st);
        let (_, e) = Self::event(st, OP, ev)?;
        // SAFETY: `e` is a live event (of any device); the stream is this context's legacy
        // default stream; flags must be 0.
        check(api, OP, unsafe { (api.cuStreamWaitEvent)(STREAM, e, 0) })
    }

    fn copy_dtod(&self, dev: u32, dst: u64, src: u64, len: u64) -> Result<(), DriverError> {
        const OP: &str = "cuMemcpyDtoDAsync";
        if len == 0 {
            return Ok(());
        }
        let n = usize::try_from(len).map_err(|_| DriverError::refused(OP, "length overflows"))?;
        let g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &g.st);
        Self::check_range(api, st, OP, dst, len)?;
        Self::check_range(api, st, OP, src, len)?;
        // SAFETY: both ranges were checked to lie inside device allocations.
        check(api, OP, unsafe { (api.cuMemcpyDtoDAsync_v2)(dst, src, n, STREAM) })
    }

    fn copy_htod(&self, dev: u32, dst: u64, src: &[u8]) -> Result<(), DriverError> {
        const OP: &str = "cuMemcpyHtoD";
        if src.is_empty() {
            return Ok(());
        }
        let g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &g.st);
        Self::check_range(api, st, OP, dst, src.len() as u64)?;
        // SAFETY: the device range was checked; `src` is a live slice of exactly that length.
        check(api, OP, unsafe { (api.cuMemcpyHtoD_v2)(dst, src.as_ptr().cast(), src.len()) })
    }

    fn copy_dtoh(&self, dev: u32, dst: &mut [u8], src: u64) -> Result<(), DriverError> {
        const OP: &str = "cuMemcpyDtoH";
        if dst.is_empty() {
            return Ok(());
        }
        let g = self.enter(OP, dev)?;
        let (api, st) = (g.api, &g.st);
        Self::check_range(api, st, OP, src, dst.len() as u64)?;
        // SAFETY: the device range was checked; `dst` is a live, exclusive slice of exactly
        // that length, and the copy has finished when the call returns.
        check(api, OP, unsafe { (api.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), src, dst.len()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a driver (CI), the probe answers "not viable" with a reason and
    /// every call is refused without touching cudarc (which would panic).
    #[test]
    fn without_a_driver_everything_is_refused_cleanly() {
        let d = CudaDriver::shared();
        // SAFETY: as in the probe: only tries to load the library.
        if unsafe { cu::is_culib_present() } {
            eprintln!("a CUDA driver is installed here; the no-driver test has nothing to check");
            return;
        }
        let why = d.probe().unwrap_err();
        assert!(why.contains("libcuda") || why.contains(DISABLE_ENV), "{why}");
        assert_eq!(d.probe().unwrap_err(), why, "cached");
        let e = d.alloc(0, 1024).unwrap_err();
        assert_eq!(e.code, None);
        assert!(d.open_mem_handle(0, &IpcHandle([1; 64])).is_err());
        assert!(d.copy_dtoh(0, &mut [0u8; 4], 0x1000).is_err());
        assert!(d.event_create(0).is_err());
    }

    #[test]
    fn handles_convert_both_ways() {
        let h = IpcHandle(std::array::from_fn(|i| (i * 7) as u8));
        assert_eq!(to_handle(&from_handle(&h)), h);
    }
}
