//! An in-memory stand-in for the CUDA driver, for tests on machines without a GPU.
//!
//! A [`FakeGpu`] is the hardware (devices with UUIDs, physical memory, IPC handle tables);
//! each [`FakeDriver`] is one *process* on it, with its own address space, its own device
//! order (as `CUDA_VISIBLE_DEVICES` would give) and its own pid. It keeps the rules the
//! real driver enforces and checks the callers against the [`Driver`] contract:
//!
//! - handles are 64 random bytes; opening an unknown handle, a freed allocation's handle,
//!   or a handle **this process exported** fails;
//! - opening the same handle twice returns the same mapping and counts it;
//! - freed addresses are handed out again (last freed first), so a new allocation can sit
//!   at the address of an old one with a new handle;
//! - memory freed by its owner stays readable through mappings other processes still hold;
//! - every pointer and length is checked against the mappings (an error, never a panic);
//! - [`FakeDriver::fail_next`] makes the next calls of an operation fail.
//!
//! Streams are not simulated: copies happen at once and events are always complete.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::driver::{DeviceInfo, Driver, DriverError, EventId, HANDLE_BYTES, IpcHandle};

/// The simulated hardware, shared by the simulated processes.
#[derive(Debug)]
pub struct FakeGpu {
    world: Mutex<World>,
}

#[derive(Debug)]
struct World {
    uuids: Vec<String>,
    phys: HashMap<u64, Phys>,
    mem_handles: HashMap<IpcHandle, (u64, u32)>,
    event_handles: HashMap<IpcHandle, (u64, u32)>,
    next: u64,
    rng: u64,
}

#[derive(Debug)]
struct Phys {
    dev: usize,
    data: Vec<u8>,
    refs: usize,
}

/// One simulated process.
#[derive(Debug)]
pub struct FakeDriver {
    gpu: Arc<FakeGpu>,
    pid: u32,
    visible: Vec<usize>,
    broken: Option<String>,
    st: Mutex<Proc>,
}

#[derive(Debug, Default)]
struct Proc {
    maps: BTreeMap<u64, Map>,
    imports: HashMap<IpcHandle, u64>,
    free_vas: Vec<(u64, u64)>,
    next_va: u64,
    events: HashMap<u64, Ev>,
    next_ev: u64,
    fail: HashMap<&'static str, u32>,
    calls: HashMap<&'static str, u64>,
}

#[derive(Debug)]
struct Map {
    phys: u64,
    size: u64,
    dev: u32,
    handle: Option<IpcHandle>,
    import_refs: Option<u32>,
}

#[derive(Debug)]
struct Ev {
    dev: u32,
    global: u64,
    handle: Option<IpcHandle>,
    records: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn err(op: &'static str, code: i32, detail: impl Into<String>) -> DriverError {
    DriverError { op, code: Some(code), detail: detail.into() }
}

const INVALID_VALUE: i32 = 1;
const INVALID_DEVICE: i32 = 101;
const INVALID_CONTEXT: i32 = 201;
const INVALID_HANDLE: i32 = 400;

impl FakeGpu {
    /// A machine with `devices` GPUs.
    pub fn new(devices: usize) -> Arc<FakeGpu> {
        let seed = std::collections::hash_map::RandomState::new().build_hasher().finish() | 1;
        let uuids = (0..devices).map(|i| format!("GPU-{:08x}-0000-4000-8000-{:012x}", seed as u32, i)).collect();
        Arc::new(FakeGpu {
            world: Mutex::new(World {
                uuids,
                phys: HashMap::new(),
                mem_handles: HashMap::new(),
                event_handles: HashMap::new(),
                next: 1,
                rng: seed,
            }),
        })
    }

    /// UUID of physical device `i`.
    pub fn uuid(&self, i: usize) -> String {
        lock(&self.world).uuids[i].clone()
    }

    /// A process with pid `pid` that sees every device, in order.
    pub fn process(self: &Arc<Self>, pid: u32) -> Arc<FakeDriver> {
        let n = lock(&self.world).uuids.len();
        self.process_with_devices(pid, (0..n).collect())
    }

    /// A process that sees physical devices `visible`, in that order (its `cuda:0` is
    /// `visible[0]`), like `CUDA_VISIBLE_DEVICES`.
    pub fn process_with_devices(self: &Arc<Self>, pid: u32, visible: Vec<usize>) -> Arc<FakeDriver> {
        let st = Proc { next_va: 0x7f00_0000_0000 + u64::from(pid % 64) * 0x10_0000_0000, ..Default::default() };
        Arc::new(FakeDriver { gpu: self.clone(), pid, visible, broken: None, st: Mutex::new(st) })
    }

    /// A process whose driver cannot be used (`probe` fails with `reason`).
    pub fn broken_process(self: &Arc<Self>, pid: u32, reason: &str) -> Arc<FakeDriver> {
        Arc::new(FakeDriver {
            gpu: self.clone(),
            pid,
            visible: Vec::new(),
            broken: Some(reason.into()),
            st: Mutex::default(),
        })
    }

    /// Physical allocations still alive (owned or mapped by some process).
    pub fn live_memory(&self) -> usize {
        lock(&self.world).phys.len()
    }
}

/// The simulated process that [`crate::CudaIpcChannel::new`] and
/// [`crate::CudaIpcChannel::with_options`] use instead of the real driver while one is set
/// ([`set_active`]): for tests that build channels where they cannot pass a driver (the
/// facade's `ferry::endpoint()`, a server's endpoint, the Python binding's pipes), e.g. two
/// simulated processes of one [`FakeGpu`] in one real process.
static ACTIVE: Mutex<Option<Arc<FakeDriver>>> = Mutex::new(None);

/// Makes channels built from now on use `driver` (`None`: the real driver again); returns
/// the one set before. Channels already built keep theirs.
pub fn set_active(driver: Option<Arc<FakeDriver>>) -> Option<Arc<FakeDriver>> {
    std::mem::replace(&mut *lock(&ACTIVE), driver)
}

/// The simulated process set by [`set_active`], if any.
pub fn active() -> Option<Arc<FakeDriver>> {
    lock(&ACTIVE).clone()
}

impl World {
    fn random_handle(&mut self) -> IpcHandle {
        let mut h = [0u8; HANDLE_BYTES];
        for chunk in h.chunks_mut(8) {
            // splitmix64
            self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        IpcHandle(h)
    }
}

impl FakeDriver {
    /// Makes the next `times` calls of `op` (e.g. `"cuIpcOpenMemHandle"`) fail.
    pub fn fail_next(&self, op: &'static str, times: u32) {
        lock(&self.st).fail.insert(op, times);
    }

    /// How many times `op` was called.
    pub fn calls(&self, op: &'static str) -> u64 {
        lock(&self.st).calls.get(op).copied().unwrap_or(0)
    }

    /// Allocations this process made and has not freed.
    pub fn live_allocs(&self) -> usize {
        lock(&self.st).maps.values().filter(|m| m.import_refs.is_none()).count()
    }

    /// Other processes' allocations this process has open (each counted once).
    pub fn open_imports(&self) -> usize {
        lock(&self.st).imports.len()
    }

    /// Events created or opened and not destroyed.
    pub fn live_events(&self) -> usize {
        lock(&self.st).events.len()
    }

    fn enter(&self, op: &'static str) -> Result<MutexGuard<'_, Proc>, DriverError> {
        if let Some(why) = &self.broken {
            return Err(DriverError::refused(op, why.clone()));
        }
        let mut st = lock(&self.st);
        *st.calls.entry(op).or_default() += 1;
        if let Some(n) = st.fail.get_mut(op)
            && *n > 0
        {
            *n -= 1;
            return Err(err(op, 999, "injected failure"));
        }
        Ok(st)
    }

    fn check_dev(&self, op: &'static str, dev: u32) -> Result<(), DriverError> {
        if (dev as usize) < self.visible.len() {
            Ok(())
        } else {
            Err(err(op, INVALID_DEVICE, format!("no device {dev}")))
        }
    }

    fn new_va(st: &mut Proc, len: u64) -> u64 {
        if let Some(i) = st.free_vas.iter().rposition(|&(_, size)| size >= len) {
            return st.free_vas.remove(i).0;
        }
        let va = st.next_va;
        st.next_va += len.next_multiple_of(2 << 20) + (2 << 20);
        va
    }

    /// The mapping holding `[va, va + len)`: (physical id, offset in it).
    fn resolve(op: &'static str, st: &Proc, va: u64, len: u64) -> Result<(u64, usize), DriverError> {
        let (&base, m) =
            st.maps.range(..=va).next_back().ok_or_else(|| err(op, INVALID_VALUE, format!("{va:#x} is not mapped")))?;
        let end = va.checked_add(len).ok_or_else(|| err(op, INVALID_VALUE, "range overflows"))?;
        if end > base + m.size {
            return Err(err(op, INVALID_VALUE, format!("{va:#x}+{len} is outside the allocation at {base:#x}")));
        }
        Ok((m.phys, (va - base) as usize))
    }

    fn event<'a>(op: &'static str, st: &'a mut Proc, ev: EventId) -> Result<&'a mut Ev, DriverError> {
        st.events.get_mut(&ev.0).ok_or_else(|| err(op, INVALID_HANDLE, format!("no event {}", ev.0)))
    }
}

impl Driver for FakeDriver {
    fn process_id(&self) -> u32 {
        self.pid
    }

    fn probe(&self) -> Result<Vec<DeviceInfo>, String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        if self.visible.is_empty() {
            return Err("no CUDA device is visible".into());
        }
        let w = lock(&self.gpu.world);
        Ok(self
            .visible
            .iter()
            .enumerate()
            .map(|(i, &p)| DeviceInfo { ordinal: i as u32, uuid: w.uuids[p].clone(), name: "Fake GPU".into() })
            .collect())
    }

    fn alloc(&self, dev: u32, len: u64) -> Result<u64, DriverError> {
        const OP: &str = "cuMemAlloc";
        let mut st = self.enter(OP)?;
        self.check_dev(OP, dev)?;
        if len == 0 || len > 1 << 34 {
            return Err(err(OP, INVALID_VALUE, format!("cannot allocate {len} bytes")));
        }
        let va = Self::new_va(&mut st, len);
        let mut w = lock(&self.gpu.world);
        let id = w.next;
        w.next += 1;
        w.phys.insert(id, Phys { dev: self.visible[dev as usize], data: vec![0xEE; len as usize], refs: 1 });
        st.maps.insert(va, Map { phys: id, size: len, dev, handle: None, import_refs: None });
        Ok(va)
    }

    fn free(&self, dev: u32, ptr: u64) -> Result<(), DriverError> {
        const OP: &str = "cuMemFree";
        let mut st = self.enter(OP)?;
        match st.maps.get(&ptr) {
            Some(m) if m.import_refs.is_none() && m.dev == dev => {}
            _ => return Err(err(OP, INVALID_VALUE, format!("{ptr:#x} is not an allocation of this process"))),
        }
        let m = st.maps.remove(&ptr).ok_or_else(|| err(OP, INVALID_VALUE, "vanished"))?;
        st.free_vas.push((ptr, m.size));
        let mut w = lock(&self.gpu.world);
        if let Some(h) = m.handle {
            w.mem_handles.remove(&h);
        }
        if let Some(p) = w.phys.get_mut(&m.phys) {
            p.refs -= 1;
            if p.refs == 0 {
                w.phys.remove(&m.phys);
            }
        }
        Ok(())
    }

    fn mem_handle(&self, dev: u32, ptr: u64) -> Result<IpcHandle, DriverError> {
        const OP: &str = "cuIpcGetMemHandle";
        let mut st = self.enter(OP)?;
        let pid = self.pid;
        let m = match st.maps.get_mut(&ptr) {
            Some(m) if m.import_refs.is_none() && m.dev == dev => m,
            _ => return Err(err(OP, INVALID_VALUE, format!("{ptr:#x} is not the base of an allocation"))),
        };
        if let Some(h) = m.handle {
            return Ok(h);
        }
        let mut w = lock(&self.gpu.world);
        let h = w.random_handle();
        w.mem_handles.insert(h, (m.phys, pid));
        m.handle = Some(h);
        Ok(h)
    }

    fn open_mem_handle(&self, dev: u32, handle: &IpcHandle) -> Result<(u64, u64), DriverError> {
        const OP: &str = "cuIpcOpenMemHandle";
        let mut st = self.enter(OP)?;
        self.check_dev(OP, dev)?;
        let mut w = lock(&self.gpu.world);
        let &(phys, owner) =
            w.mem_handles.get(handle).ok_or_else(|| err(OP, INVALID_VALUE, "unknown or freed handle"))?;
        if owner == self.pid {
            return Err(err(OP, INVALID_CONTEXT, "a process cannot open an IPC handle it exported"));
        }
        let p = w.phys.get_mut(&phys).ok_or_else(|| err(OP, INVALID_VALUE, "memory is gone"))?;
        if p.dev != self.visible[dev as usize] {
            return Err(err(OP, INVALID_DEVICE, "the allocation is on another device"));
        }
        let size = p.data.len() as u64;
        if let Some(&va) = st.imports.get(handle) {
            if let Some(m) = st.maps.get_mut(&va) {
                m.import_refs = m.import_refs.map(|r| r + 1);
            }
            return Ok((va, size));
        }
        p.refs += 1;
        drop(w);
        let va = Self::new_va(&mut st, size);
        st.maps.insert(va, Map { phys, size, dev, handle: Some(*handle), import_refs: Some(1) });
        st.imports.insert(*handle, va);
        Ok((va, size))
    }

    fn close_mem_handle(&self, dev: u32, ptr: u64) -> Result<(), DriverError> {
        const OP: &str = "cuIpcCloseMemHandle";
        let mut st = self.enter(OP)?;
        let m = match st.maps.get_mut(&ptr) {
            Some(m) if m.import_refs.is_some() && m.dev == dev => m,
            _ => return Err(err(OP, INVALID_VALUE, format!("{ptr:#x} is not an opened IPC mapping"))),
        };
        let refs = m.import_refs.unwrap_or(1) - 1;
        m.import_refs = Some(refs);
        if refs > 0 {
            return Ok(());
        }
        let m = st.maps.remove(&ptr).ok_or_else(|| err(OP, INVALID_VALUE, "vanished"))?;
        if let Some(h) = m.handle {
            st.imports.remove(&h);
        }
        st.free_vas.push((ptr, m.size));
        let mut w = lock(&self.gpu.world);
        if let Some(p) = w.phys.get_mut(&m.phys) {
            p.refs -= 1;
            if p.refs == 0 {
                w.phys.remove(&m.phys);
            }
        }
        Ok(())
    }

    fn event_create(&self, dev: u32) -> Result<EventId, DriverError> {
        const OP: &str = "cuEventCreate";
        let mut st = self.enter(OP)?;
        self.check_dev(OP, dev)?;
        let global = {
            let mut w = lock(&self.gpu.world);
            w.next += 1;
            w.next
        };
        st.next_ev += 1;
        let id = st.next_ev;
        st.events.insert(id, Ev { dev, global, handle: None, records: 0 });
        Ok(EventId(id))
    }

    fn event_handle(&self, dev: u32, ev: EventId) -> Result<IpcHandle, DriverError> {
        const OP: &str = "cuIpcGetEventHandle";
        let mut st = self.enter(OP)?;
        let pid = self.pid;
        let e = Self::event(OP, &mut st, ev)?;
        if e.dev != dev {
            return Err(err(OP, INVALID_VALUE, "event is on another device"));
        }
        if let Some(h) = e.handle {
            return Ok(h);
        }
        let mut w = lock(&self.gpu.world);
        let h = w.random_handle();
        w.event_handles.insert(h, (e.global, pid));
        e.handle = Some(h);
        Ok(h)
    }

    fn event_open(&self, dev: u32, handle: &IpcHandle) -> Result<EventId, DriverError> {
        const OP: &str = "cuIpcOpenEventHandle";
        let mut st = self.enter(OP)?;
        self.check_dev(OP, dev)?;
        let &(global, owner) = lock(&self.gpu.world)
            .event_handles
            .get(handle)
            .ok_or_else(|| err(OP, INVALID_VALUE, "unknown event handle"))?;
        if owner == self.pid {
            return Err(err(OP, INVALID_CONTEXT, "a process cannot open an event handle it exported"));
        }
        st.next_ev += 1;
        let id = st.next_ev;
        st.events.insert(id, Ev { dev, global, handle: None, records: 0 });
        Ok(EventId(id))
    }

    fn event_destroy(&self, _dev: u32, ev: EventId) -> Result<(), DriverError> {
        const OP: &str = "cuEventDestroy";
        let mut st = self.enter(OP)?;
        st.events.remove(&ev.0).map(drop).ok_or_else(|| err(OP, INVALID_HANDLE, format!("no event {}", ev.0)))
    }

    fn event_record(&self, dev: u32, ev: EventId) -> Result<(), DriverError> {
        const OP: &str = "cuEventRecord";
        let mut st = self.enter(OP)?;
        let e = Self::event(OP, &mut st, ev)?;
        if e.dev != dev {
            return Err(err(OP, INVALID_VALUE, "event is on another device"));
        }
        e.records += 1;
        Ok(())
    }

    fn event_sync(&self, _dev: u32, ev: EventId) -> Result<(), DriverError> {
        const OP: &str = "cuEventSynchronize";
        let mut st = self.enter(OP)?;
        Self::event(OP, &mut st, ev).map(drop)
    }

    fn wait_event(&self, dev: u32, ev: EventId) -> Result<(), DriverError> {
        const OP: &str = "cuStreamWaitEvent";
        let mut st = self.enter(OP)?;
        self.check_dev(OP, dev)?;
        Self::event(OP, &mut st, ev).map(drop)
    }

    fn copy_dtod(&self, dev: u32, dst: u64, src: u64, len: u64) -> Result<(), DriverError> {
        const OP: &str = "cuMemcpyDtoDAsync";
        let st = self.enter(OP)?;
        self.check_dev(OP, dev)?;
        let (dp, doff) = Self::resolve(OP, &st, dst, len)?;
        let (sp, soff) = Self::resolve(OP, &st, src, len)?;
        let mut w = lock(&self.gpu.world);
        let bytes = w.phys[&sp].data[soff..soff + len as usize].to_vec();
        let d = w.phys.get_mut(&dp).ok_or_else(|| err(OP, INVALID_VALUE, "memory is gone"))?;
        d.data[doff..doff + len as usize].copy_from_slice(&bytes);
        Ok(())
    }

    fn copy_htod(&self, dev: u32, dst: u64, src: &[u8]) -> Result<(), DriverError> {
        const OP: &str = "cuMemcpyHtoD";
        let st = self.enter(OP)?;
        self.check_dev(OP, dev)?;
        let (dp, doff) = Self::resolve(OP, &st, dst, src.len() as u64)?;
        let mut w = lock(&self.gpu.world);
        let d = w.phys.get_mut(&dp).ok_or_else(|| err(OP, INVALID_VALUE, "memory is gone"))?;
        d.data[doff..doff + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn copy_dtoh(&self, dev: u32, dst: &mut [u8], src: u64) -> Result<(), DriverError> {
        const OP: &str = "cuMemcpyDtoH";
        let st = self.enter(OP)?;
        self.check_dev(OP, dev)?;
        let (sp, soff) = Self::resolve(OP, &st, src, dst.len() as u64)?;
        let w = lock(&self.gpu.world);
        let s = w.phys.get(&sp).ok_or_else(|| err(OP, INVALID_VALUE, "memory is gone"))?;
        dst.copy_from_slice(&s.data[soff..soff + dst.len()]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_keeps_the_drivers_rules() {
        let gpu = FakeGpu::new(2);
        let a = gpu.process(1);
        let b = gpu.process_with_devices(2, vec![1, 0]);
        assert_eq!(a.probe().unwrap()[1].uuid, b.probe().unwrap()[0].uuid, "same GPU, other ordinal");
        let p = a.alloc(0, 1000).unwrap();
        a.copy_htod(0, p, &[7; 1000]).unwrap();
        let h = a.mem_handle(0, p).unwrap();
        assert_eq!(a.mem_handle(0, p).unwrap(), h, "stable per allocation");
        assert!(a.open_mem_handle(0, &h).is_err(), "own handle");
        assert!(b.open_mem_handle(0, &h).is_err(), "b's cuda:0 is a's cuda:1");
        let (q, size) = b.open_mem_handle(1, &h).unwrap();
        assert_eq!(size, 1000);
        assert_eq!(b.open_mem_handle(1, &h).unwrap().0, q, "opened twice: same mapping");
        let mut out = [0u8; 10];
        b.copy_dtoh(1, &mut out, q + 990).unwrap();
        assert_eq!(out, [7; 10]);
        assert!(b.copy_dtoh(1, &mut out, q + 991).is_err(), "past the end");
        // The owner frees: the mapping still reads, the handle no longer opens.
        a.free(0, p).unwrap();
        b.copy_dtoh(1, &mut out, q).unwrap();
        assert!(gpu.process(3).open_mem_handle(0, &h).is_err());
        // The address comes back with a new handle.
        let p2 = a.alloc(0, 500).unwrap();
        assert_eq!(p2, p, "address reused");
        assert_ne!(a.mem_handle(0, p2).unwrap(), h);
        b.close_mem_handle(1, q).unwrap();
        assert_eq!(b.open_imports(), 1);
        b.close_mem_handle(1, q).unwrap();
        assert_eq!(b.open_imports(), 0);
        assert!(b.close_mem_handle(1, q).is_err());
        a.free(0, p2).unwrap();
        assert_eq!(gpu.live_memory(), 0);
        a.fail_next("cuMemAlloc", 1);
        assert!(a.alloc(0, 1).is_err());
        assert!(a.alloc(0, 1).is_ok());
        assert!(gpu.broken_process(9, "no libcuda").probe().is_err());
    }

    #[test]
    fn events_cross_processes_only() {
        let gpu = FakeGpu::new(1);
        let (a, b) = (gpu.process(1), gpu.process(2));
        let e = a.event_create(0).unwrap();
        let h = a.event_handle(0, e).unwrap();
        assert!(a.event_open(0, &h).is_err());
        let o = b.event_open(0, &h).unwrap();
        a.event_record(0, e).unwrap();
        b.wait_event(0, o).unwrap();
        b.event_destroy(0, o).unwrap();
        assert!(b.wait_event(0, o).is_err());
        assert!(a.event_record(0, EventId(12345)).is_err());
    }
}
