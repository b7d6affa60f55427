//! The device tier (`cuda:N`) above the cpu and disk tiers, on a GPU simulated in memory
//! (`ferry_cuda_ipc::fake`) with its memory in the cuda-ipc pool (`CudaMemory`): tensors
//! leave the device by the policy (copied down to the cpu tier, then disk, real files) and
//! come back on it intact for each use; genoa uploads for a use and lets go after; a tensor
//! in use is never moved under its user; a declared schedule uploads ahead; placements by
//! hand, budgets and failures of the driver are errors that name what failed.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{Device, DeviceBuffer};
use ferry_cuda_ipc::fake::{FakeDriver, FakeGpu};
use ferry_cuda_ipc::{CudaIpcChannel, CudaIpcOptions};
use ferry_store::placement::{
    CudaMemory, DeviceMemory, DevicePin, DeviceTier, Flow, FlowOptions, Genoa, Lru, Pin, Tier, TierError, TierOptions,
    Tiers,
};

const KB: usize = 1 << 10;
const LEN: usize = 256 * KB;
const SETTLE: Duration = Duration::from_secs(20);

struct Rig {
    mem: Arc<CudaMemory>,
    drv: Arc<FakeDriver>,
    below: Arc<Tiers>,
    _dir: tempfile::TempDir,
}

/// A simulated GPU process's `cuda:0` (pool slabs of 1 MiB) above a cpu tier of `cpu`
/// tensors and a disk tier in a temporary directory.
fn rig(cpu: usize) -> Rig {
    let gpu = FakeGpu::new(1);
    let drv = gpu.process(100);
    let opts = CudaIpcOptions { slab_bytes: 1 << 20, ..CudaIpcOptions::default() };
    let chan = CudaIpcChannel::with_driver(drv.clone(), opts);
    let mem = Arc::new(CudaMemory::new(chan, 0).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let below =
        Arc::new(Tiers::new(TierOptions::new((cpu * LEN) as u64, dir.path()), Box::new(Lru::default())).unwrap());
    Rig { mem, drv, below, _dir: dir }
}

impl Rig {
    fn tier(&self, tensors: usize, policy: Box<dyn ferry_store::placement::Policy + Send>) -> DeviceTier {
        DeviceTier::new(self.mem.clone(), (tensors * LEN) as u64, policy, self.below.clone()).unwrap()
    }

    /// Tensor `i` on the device: `LEN` bytes, each `i`.
    fn tensor(&self, i: usize) -> Arc<dyn DeviceBuffer> {
        self.mem.upload(&vec![i as u8; LEN]).unwrap()
    }

    /// Whether `buf` holds tensor `i`'s bytes (read back from the device).
    fn holds(&self, buf: &Arc<dyn DeviceBuffer>, i: usize) -> bool {
        self.mem.download(buf).unwrap() == vec![i as u8; LEN]
    }
}

#[test]
fn tensors_leave_the_device_by_the_policy_and_every_use_gets_them_back_on_it_intact() {
    let r = rig(2);
    let tier = r.tier(2, Box::new(Lru::default()));
    let keys: Vec<_> = (0..6).map(|i| tier.put(r.tensor(i)).unwrap()).collect();
    assert!(tier.settle(SETTLE));
    assert!(tier.usage() <= 2 * LEN as u64);
    let s = tier.stats();
    assert_eq!(s.bytes_down, 4 * LEN as u64, "the four oldest were copied down once each");
    // Two of them in the cpu tier (its budget), the others on disk.
    let below: Vec<_> = keys.iter().map(|&k| tier.state(k).unwrap().below).collect();
    assert_eq!(below.iter().filter(|b| **b == Some(Tier::Cpu)).count(), 2, "{below:?}");
    assert_eq!(below.iter().filter(|b| **b == Some(Tier::Disk)).count(), 2, "{below:?}");
    assert_eq!(below.iter().filter(|b| b.is_none()).count(), 2, "{below:?}");
    // Two passes over all: every use on the device, bytes intact.
    for _ in 0..2 {
        for (i, &k) in keys.iter().enumerate() {
            let buf = tier.get(k).unwrap();
            assert_eq!(buf.device(), Device::Cuda(0));
            assert!(r.holds(&buf, i), "tensor {i} came back changed");
            drop(buf);
            assert!(tier.settle(SETTLE));
            assert!(tier.usage() <= 2 * LEN as u64);
        }
    }
    let s = tier.stats();
    assert_eq!(s.uses, 12);
    assert_eq!(s.bytes_down, 6 * LEN as u64, "each tensor is copied down at most once");
    assert!(s.bytes_up >= 10 * LEN as u64, "LRU over 6 tensors in 2 slots misses every use: {s:?}");
    assert_eq!(s.last_error, None);
}

#[test]
fn genoa_uploads_for_the_use_and_lets_go_after_and_a_held_tensor_stays_until_let_go() {
    let r = rig(4);
    let tier = r.tier(4, Box::new(Genoa));
    let k = tier.put(r.tensor(7)).unwrap();
    assert!(tier.settle(SETTLE));
    assert_eq!(tier.state(k).unwrap().below, Some(Tier::Cpu), "genoa keeps nothing on the device");
    let buf = tier.get(k).unwrap();
    assert!(r.holds(&buf, 7));
    assert!(tier.settle(SETTLE));
    let s = tier.state(k).unwrap();
    assert!(s.in_use && s.deferred, "let go by the policy while held: {s:?}");
    assert_eq!(s.below, None, "still on the device while held");
    assert_eq!(tier.stats().held_over_bytes, LEN as u64);
    assert_eq!(tier.usage(), 0);
    // The holder's memory is unchanged and readable however long it holds it.
    std::thread::sleep(Duration::from_millis(50));
    assert!(r.holds(&buf, 7));
    drop(buf);
    assert!(tier.settle(SETTLE));
    let s = tier.state(k).unwrap();
    assert!(!s.in_use && !s.deferred && s.below == Some(Tier::Cpu), "{s:?}");
    assert_eq!(tier.stats().held_over_bytes, 0);
    let st = tier.stats();
    assert_eq!((st.uses, st.hits, st.waits), (1, 0, 1));
    assert_eq!(st.bytes_down, LEN as u64, "copied down once, at the put");
}

#[test]
fn a_declared_schedule_uploads_ahead_of_use() {
    let r = rig(8);
    let tier = r.tier(3, Box::new(Flow::new(FlowOptions::default())));
    let keys: Vec<_> = (0..8).map(|i| tier.put(r.tensor(i)).unwrap()).collect();
    assert!(tier.settle(SETTLE));
    let order: Vec<_> = keys.iter().chain(keys.iter()).copied().collect();
    tier.schedule(&order);
    let mut ahead = 0;
    for (n, &k) in order.iter().enumerate() {
        let i = keys.iter().position(|&x| x == k).unwrap();
        assert!(r.holds(&tier.get(k).unwrap(), i));
        assert!(tier.settle(SETTLE));
        if let Some(&next) = order.get(n + 1)
            && tier.state(next).unwrap().below.is_none()
        {
            ahead += 1;
        }
        assert!(tier.usage() <= 3 * LEN as u64);
    }
    assert!(ahead >= order.len() - 2, "the next tensor was on the device before {ahead} of {} uses", order.len());
    let s = tier.stats();
    assert!(s.prefetches > 0 && s.hits >= (order.len() - 2) as u64, "{s:?}");
}

#[test]
fn tensors_placed_by_hand_stay_put_within_the_budget() {
    let r = rig(4);
    let tier = r.tier(2, Box::new(Lru::default()));
    let keys: Vec<_> = (0..4).map(|i| tier.put(r.tensor(i)).unwrap()).collect();
    assert!(tier.settle(SETTLE));
    // Pinned on the device: uploaded, and kept there through other uses.
    tier.place(keys[0], DevicePin::Device).unwrap();
    tier.place(keys[1], DevicePin::Device).unwrap();
    match tier.place(keys[2], DevicePin::Device) {
        Err(e @ TierError::DeviceFull { .. }) => assert!(e.to_string().contains("device tier's budget"), "{e}"),
        other => panic!("pinning past the budget: {other:?}"),
    }
    assert!(tier.settle(SETTLE));
    for &k in &keys {
        drop(tier.get(k).unwrap());
        assert!(tier.settle(SETTLE));
    }
    for &k in &keys[..2] {
        let s = tier.state(k).unwrap();
        assert_eq!((s.below, s.pin), (None, DevicePin::Device), "pinned stays on the device");
    }
    assert_eq!(tier.usage(), 2 * LEN as u64);
    // Pinned on disk: each use uploads it from its file and lets it go.
    tier.place(keys[0], DevicePin::Below(Pin::Disk)).unwrap();
    assert!(tier.settle(SETTLE));
    assert_eq!(tier.state(keys[0]).unwrap().below, Some(Tier::Disk));
    let up = tier.stats().bytes_up;
    assert!(r.holds(&tier.get(keys[0]).unwrap(), 0));
    assert!(tier.settle(SETTLE));
    assert_eq!(tier.stats().bytes_up, up + LEN as u64);
    assert_eq!(tier.state(keys[0]).unwrap().below, Some(Tier::Disk));
    // A budget below the pinned bytes is refused; back to the policy, it is accepted.
    assert!(matches!(tier.set_budget(0), Err(TierError::DeviceFull { .. })));
    tier.place(keys[1], DevicePin::Auto).unwrap();
    tier.set_budget(0).unwrap();
    assert!(tier.settle(SETTLE));
    assert_eq!(tier.usage(), 0);
    for (i, &k) in keys.iter().enumerate() {
        assert!(tier.state(k).unwrap().below.is_some(), "tensor {i} left the device");
        assert!(r.holds(&tier.get(k).unwrap(), i));
    }
}

#[test]
fn a_failed_upload_is_an_error_naming_it_and_the_tier_goes_on() {
    let r = rig(4);
    let tier = r.tier(1, Box::new(Genoa));
    let k = tier.put(r.tensor(3)).unwrap();
    assert!(tier.settle(SETTLE));
    r.drv.fail_next("cuMemcpyHtoD", 1);
    match tier.get(k) {
        Err(e @ TierError::Device(_)) => assert!(e.to_string().contains("cuMemcpyHtoD"), "{e}"),
        other => panic!("a failed upload: {:?}", other.map(|b| b.len())),
    }
    assert!(tier.stats().last_error.is_some_and(|e| e.contains("upload of tensor")));
    assert!(r.holds(&tier.get(k).unwrap(), 3), "the next use uploads it");
    // A tensor on another device is refused.
    let gpu2 = FakeGpu::new(2);
    let other = CudaIpcChannel::with_driver(gpu2.process(200), CudaIpcOptions::default());
    let on1 = CudaMemory::new(other, 1).unwrap().upload(&[1u8; 16]).unwrap();
    assert!(matches!(tier.put(on1), Err(TierError::Device(_))));
    assert!(CudaMemory::new(CudaIpcChannel::with_driver(r.drv.clone(), CudaIpcOptions::default()), 5).is_err());
}

#[test]
fn removed_and_dropped_tensors_leave_nothing_on_the_device_or_below() {
    let r = rig(1);
    let tier = r.tier(1, Box::new(Lru::default()));
    let keys: Vec<_> = (0..3).map(|i| tier.put(r.tensor(i)).unwrap()).collect();
    assert!(tier.settle(SETTLE));
    assert_eq!(r.below.usage().1, 2 * LEN as u64, "two host copies");
    tier.remove(keys[0]);
    assert!(matches!(tier.get(keys[0]), Err(TierError::Unknown(_))));
    assert_eq!(r.below.usage().1, LEN as u64, "its host copy went with it");
    drop(tier);
    assert_eq!(r.below.usage().1, 0, "dropping the tier removes its host copies");
    assert!(r.drv.live_allocs() <= 1, "the pool keeps at most its slab: {}", r.drv.live_allocs());
}
