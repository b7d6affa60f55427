//! The placement of the store's tensor references over JSON-RPC: `store.placement.get` /
//! `store.placement.set` (the policy and the per-tier budgets), `store.ref.placement` /
//! `store.ref.place` (where one reference is; move it), `store.ref.schedule` (the order of
//! the next uses, for prefetching). See [`crate::PlacedRefs`].
//!
//! On a store without placement ([`crate::Store::enable_placement`] not called) the
//! references stay in memory as kept: `store.placement.get` says so (policy `pinned`,
//! `tiers: false`), a reference's placement is its device, and the setters answer
//! INVALID_PARAMS naming the option that enables placement.

use std::sync::Arc;

use ferry_rpc::{CallContext, ErrorObject, Methods, RegisterError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{PlacedRefs, Store};

/// Params of `store.placement.get` (none).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementGetParams {}

/// Params of `store.placement.set`: each field given is changed.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementSetParams {
    /// The policy: `pinned`, `genoa`, `lru` or `flow`. A change starts the cpu tier over
    /// (what the old policy kept goes down; references placed by hand stay).
    #[serde(default)]
    pub policy: Option<String>,
    /// Bytes of references the cpu tier holds (a smaller tier moves its least recently
    /// used references down, in the background).
    #[serde(default)]
    pub cpu_budget_bytes: Option<u64>,
    /// Bytes of references the disk tier holds (every reference counts there).
    #[serde(default)]
    pub disk_budget_bytes: Option<u64>,
    /// Bytes of references the device tier holds (a smaller tier moves its least recently
    /// used references off the device, in the background). INVALID_PARAMS on a store
    /// without a device tier.
    #[serde(default)]
    pub device_budget_bytes: Option<u64>,
}

/// What the device tier did so far.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DeviceTierStats {
    /// Uses of references homed on the device (calls taking them, fetches).
    pub uses: u64,
    /// Uses of a reference placed on the device (kept, pinned, or uploaded ahead).
    pub hits: u64,
    /// Uses that waited for an upload.
    pub waits: u64,
    /// Bytes copied to the device.
    pub bytes_up: u64,
    /// Bytes copied from the device to the host (each reference at most once).
    pub bytes_down: u64,
    /// Uploads started ahead of a use.
    pub prefetches: u64,
    /// Milliseconds uses waited for uploads.
    pub stalled_ms: f64,
    /// The last move that failed (the reference stayed where it was).
    pub last_error: Option<String>,
    /// Moves off the device deferred because the reference was in use.
    pub deferred: u64,
    /// Bytes on the device waiting for their users to let go, beyond `used_bytes`.
    pub held_over_bytes: u64,
}

/// The device tier (`cuda:N`) above the cpu tier, for references kept from that device.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DeviceTierInfo {
    /// The device (`cuda:0`).
    pub device: String,
    /// Its policy (the store's policy, an instance of its own).
    pub policy: String,
    /// Bytes it holds at most.
    pub budget_bytes: u64,
    /// Bytes of references on it.
    pub used_bytes: u64,
    /// What it did so far.
    pub stats: DeviceTierStats,
}

/// What the tiers did so far.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PlacementStats {
    /// Uses of references (calls taking them, fetches).
    pub uses: u64,
    /// Uses of a reference placed in the cpu tier (kept, pinned, or prefetched ahead).
    pub hits: u64,
    /// Uses that waited for bytes from disk (read them, or waited for a prefetch).
    pub waits: u64,
    /// Bytes read from disk into memory.
    pub bytes_read: u64,
    /// Bytes written to disk (each reference at most once).
    pub bytes_written: u64,
    /// Prefetches started.
    pub prefetches: u64,
    /// Milliseconds uses waited for bytes from disk.
    pub stalled_ms: f64,
    /// The last background move that failed (the reference stayed where it was).
    pub last_error: Option<String>,
    /// Moves down deferred because the reference was in use.
    #[serde(default)]
    pub deferred: u64,
    /// Bytes of references waiting for their users to let go before they go down: in
    /// memory beyond `cpu_used_bytes`.
    #[serde(default)]
    pub held_over_bytes: u64,
}

/// The store's placement: its policy, budgets and usage.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PlacementInfo {
    /// Whether references are placed in tiers (false: kept in memory as they came).
    pub tiers: bool,
    /// The policy (`pinned` without tiers).
    pub policy: String,
    /// Bytes the cpu tier holds at most (null without tiers).
    pub cpu_budget_bytes: Option<u64>,
    /// Bytes the disk tier holds at most (null without tiers).
    pub disk_budget_bytes: Option<u64>,
    /// Bytes of references in the cpu tier.
    pub cpu_used_bytes: u64,
    /// Bytes of references counted in the disk tier (all of them).
    pub disk_used_bytes: u64,
    /// The disk tier's directory.
    pub disk_dir: Option<String>,
    /// What the tiers did so far (null without tiers).
    pub stats: Option<PlacementStats>,
    /// The device tier (null without one).
    #[serde(default)]
    pub device: Option<DeviceTierInfo>,
}

/// Params of `store.ref.placement`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefPlacementParams {
    /// The reference's id (using the reference itself would count as a use).
    pub id: String,
}

/// Params of `store.ref.place`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlaceParams {
    /// The reference's id.
    pub id: String,
    /// `cpu` (pinned in the cpu tier, within its budget), `disk` (pinned on disk: each use
    /// reads it), `auto` (back to the policy), or the device tier's device (`cuda:0`:
    /// pinned there, for a reference kept from that device; `cpu` and `disk` then keep it
    /// off the device, and each use uploads it).
    pub placement: String,
}

/// Where a reference is.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RefPlacement {
    /// The reference's id.
    pub id: String,
    /// Its tier: `cpu`, `disk`, or a device (`cuda:0`: on the device tier, or on a device
    /// without one, where it stays).
    pub placement: String,
    /// How it was placed by hand: `auto`, `cpu`, `disk` or the device tier's device.
    pub pinned: String,
    /// A move to or from disk is under way.
    pub moving: bool,
    /// A call or a reader holds its bytes (it is never moved under them).
    pub in_use: bool,
    /// The policy let it go while in use: it stays in the cpu tier until its users let go,
    /// then goes down.
    #[serde(default)]
    pub deferred: bool,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Params of `store.ref.schedule`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleParams {
    /// Reference ids in the order of their next uses (repeats allowed: a model's layers,
    /// pass after pass); replaces the schedule declared before.
    pub ids: Vec<String>,
}

/// What `store.ref.schedule` did.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct Scheduled {
    /// Uses scheduled (0 on a store without tiers; a policy that does not prefetch
    /// ignores the schedule).
    pub scheduled: u64,
}

fn no_tiers(field: &str) -> ErrorObject {
    ErrorObject::invalid_params(
        field,
        "this store keeps its references in memory, unplaced: start it with a placement policy \
         (`ferry serve-weights --placement POLICY`, Store::enable_placement)",
    )
}

fn info(p: Option<&Arc<PlacedRefs>>) -> PlacementInfo {
    let Some(p) = p else {
        return PlacementInfo {
            tiers: false,
            policy: "pinned".into(),
            cpu_budget_bytes: None,
            disk_budget_bytes: None,
            cpu_used_bytes: 0,
            disk_used_bytes: 0,
            disk_dir: None,
            stats: None,
            device: None,
        };
    };
    let t = p.tiers();
    let ((cpu_budget, disk_budget), (cpu_used, disk_used), s) = (t.budgets(), t.usage(), t.stats());
    PlacementInfo {
        tiers: true,
        policy: t.policy_name(),
        cpu_budget_bytes: Some(cpu_budget),
        disk_budget_bytes: Some(disk_budget),
        cpu_used_bytes: cpu_used,
        disk_used_bytes: disk_used,
        disk_dir: Some(p.disk_dir().display().to_string()),
        stats: Some(PlacementStats {
            uses: s.uses,
            hits: s.hits,
            waits: s.waits,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
            prefetches: s.prefetches,
            stalled_ms: s.stalled.as_secs_f64() * 1e3,
            last_error: s.last_error,
            deferred: s.deferred,
            held_over_bytes: s.held_over_bytes,
        }),
        device: p.device_tier().map(|d| {
            let s = d.stats();
            DeviceTierInfo {
                device: d.device().to_string(),
                policy: d.policy_name(),
                budget_bytes: d.budget(),
                used_bytes: d.usage(),
                stats: DeviceTierStats {
                    uses: s.uses,
                    hits: s.hits,
                    waits: s.waits,
                    bytes_up: s.bytes_up,
                    bytes_down: s.bytes_down,
                    prefetches: s.prefetches,
                    stalled_ms: s.stalled.as_secs_f64() * 1e3,
                    last_error: s.last_error,
                    deferred: s.deferred,
                    held_over_bytes: s.held_over_bytes,
                },
            }
        }),
    }
}

/// Where the caller's reference `id` is.
fn ref_placement(store: &Store, ctx: &CallContext, id: &str) -> Result<RefPlacement, ErrorObject> {
    let r = ctx.ref_info(id)?;
    let Some(p) = store.placement() else {
        let placement = r.device.to_string();
        return Ok(RefPlacement {
            id: r.id,
            placement,
            pinned: "auto".into(),
            moving: false,
            in_use: false,
            deferred: false,
            bytes: r.bytes,
        });
    };
    let s = p.state(id)?;
    Ok(RefPlacement {
        id: r.id,
        placement: s.placement,
        pinned: s.pinned,
        moving: s.moving,
        in_use: s.in_use,
        deferred: s.deferred,
        bytes: s.bytes,
    })
}

/// Registers the placement methods on `m`.
pub(crate) fn register(m: &mut Methods, store: &Arc<Store>) -> Result<(), RegisterError> {
    let s = store.clone();
    m.register("store.placement.get", move |_: PlacementGetParams| {
        let s = s.clone();
        async move { Ok::<_, ErrorObject>(info(s.placement())) }
    })?
    .summary("The store's placement of tensor references: policy, per-tier budgets, usage and counts")
    .inline();
    let s = store.clone();
    // At the normal policy, as `store.publish` (the store's own work takes its locks).
    m.register("store.placement.set", move |p: PlacementSetParams| {
        let s = s.clone();
        let job = tokio::task::spawn_blocking(move || {
            let placed = s.placement().ok_or_else(|| no_tiers("policy"))?;
            placed.configure(p.policy.as_deref(), p.cpu_budget_bytes, p.disk_budget_bytes, p.device_budget_bytes)?;
            Ok(info(Some(placed)))
        });
        async move { job.await.map_err(|e| ErrorObject::internal(format!("the placement change failed: {e}")))? }
    })?
    .summary("Change the store's placement policy and per-tier budgets")
    .description(
        "Each field given is changed. An unknown policy is INVALID_PARAMS naming policy; a cpu budget below the \
         bytes pinned there, a disk budget below the bytes stored, or a device budget below the bytes pinned on \
         the device is LIMIT_EXCEEDED naming cpu_budget_bytes, disk_budget_bytes or device_budget_bytes. Moves \
         it causes run in the background.",
    );
    let s = store.clone();
    m.register_ctx("store.ref.placement", move |p: RefPlacementParams, ctx: CallContext| {
        let s = s.clone();
        async move { ref_placement(&s, &ctx, &p.id) }
    })?
    .summary("Where one of the caller's tensor references is: cpu, disk or a device; moving, in use")
    .description("NOT_FOUND for a reference the caller does not hold. Looking does not count as a use.");
    let s = store.clone();
    m.register_ctx("store.ref.place", move |p: PlaceParams, ctx: CallContext| {
        let s = s.clone();
        async move {
            ctx.ref_info(&p.id)?;
            let placed = s.placement().ok_or_else(|| no_tiers("placement"))?;
            placed.place(&p.id, &p.placement)?;
            ref_placement(&s, &ctx, &p.id)
        }
    })?
    .summary("Place one of the caller's tensor references by hand: cpu, disk, the device tier's device, or auto (the policy)")
    .description(
        "The move runs in the background (`moving` in the answer); a call or a reader holding the reference keeps \
         its bytes, unchanged, until it lets go. Pinning past the cpu tier's budget is LIMIT_EXCEEDED naming \
         cpu_budget_bytes.",
    );
    let s = store.clone();
    m.register_ctx("store.ref.schedule", move |p: ScheduleParams, ctx: CallContext| {
        let s = s.clone();
        async move {
            for id in &p.ids {
                ctx.ref_info(id)?;
            }
            let n = s.placement().map_or(0, |placed| placed.schedule(&p.ids));
            Ok::<_, ErrorObject>(Scheduled { scheduled: n as u64 })
        }
    })?
    .summary("Declare the order of the next uses of the caller's references (the policy prefetches ahead)")
    .description(
        "Replaces the schedule declared before. With the flow policy, the references used next are read into the \
         cpu tier while the caller computes. NOT_FOUND for an id the caller does not hold.",
    );
    Ok(())
}
