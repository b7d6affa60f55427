//! The soak's dead-peer phase (issue 43, point 1): ring pipes whose peer (`ferry __echo`)
//! stops reading, so this side's send blocks on the full ring, and is then SIGKILLed. Each
//! blocked send must fail with `PipeError::PeerGone`, and this process must give back every
//! descriptor and ring mapping. How long after the death each send failed is reported (the
//! target is within 100 ms), never asserted.

#[cfg(feature = "ring")]
pub(super) use imp::killed_ring_peers;

/// Without the ring there is nothing to soak here.
#[cfg(not(feature = "ring"))]
pub(super) async fn killed_ring_peers(_: &mut super::Ctx) -> anyhow::Result<String> {
    Ok("skipped: this ferry was built without the `ring` feature".into())
}

#[cfg(feature = "ring")]
mod imp {
    use std::time::{Duration, Instant};

    use anyhow::{Context, bail, ensure};
    use ferry_core::{Message, PipeError, Tensor};
    use serde_json::json;

    use super::super::{Ctx, usage};
    use crate::bench::start_child;

    /// Most messages a fill may take before the ring is full (a bound, never reached).
    const MAX_FILL: usize = 1_000_000;

    pub(crate) async fn killed_ring_peers(ctx: &mut Ctx) -> anyhow::Result<String> {
        let me = std::process::id();
        let ep = ferry::endpoint().ring(Some(ferry_core::RingOptions::default())).build();
        let before = usage(me);
        let mut took: Vec<Duration> = Vec::with_capacity(ctx.counts.kills);
        let mut filled = 0usize;
        for i in 0..ctx.counts.kills {
            let addr = format!("unix:ferry-soak-stall-{me}-{i}");
            let (mut peer, _) = start_child(&ctx.exe, &["__echo", &addr], "ready")?;
            let pipe = std::sync::Arc::new(ep.connect(&addr).await.context("connecting to the echo peer")?);
            ensure!(pipe.info().features.iter().any(|f| f == "ring"), "the pipe to the echo peer has no ring");
            pipe.send(Message::new(json!({"bench": "stall"}))).await?;
            let p = pipe.clone();
            let stuck = tokio::task::spawn_blocking(move || -> anyhow::Result<(usize, Result<(), PipeError>)> {
                let x = Tensor::from_slice(vec![64], &[1u8; 64])?;
                for n in 0..MAX_FILL {
                    match p
                        .send_blocking_timeout(Message::with_tensors(json!({"n": n}), vec![x.clone()]), Some(FILL_WAIT))
                    {
                        Ok(()) => {}
                        Err(PipeError::Timeout(..)) => {
                            ensure!(!p.is_closed(), "a send that timed out closed the pipe");
                            // Full: this send waits for a peer that never reads again.
                            return Ok((n, p.send_blocking(Message::new(json!({"stuck": true})))));
                        }
                        Err(e) => bail!("filling the ring: {e}"),
                    }
                }
                bail!("the ring never filled")
            });
            // Until the fill is done and the last send waits (no way to see that from here
            // but time: a send still filling when the peer dies fails the same way).
            tokio::time::sleep(FILL_WAIT * 4).await;
            peer.kill();
            let died = Instant::now();
            let (n, r) = tokio::time::timeout(Duration::from_secs(60), stuck)
                .await
                .context("a send blocked on a dead peer never returned")???;
            took.push(died.elapsed());
            filled = filled.max(n);
            match r {
                Err(PipeError::PeerGone) => {}
                other => bail!("peer {i}: the blocked send returned {other:?}, not PeerGone"),
            }
            drop(pipe);
        }
        super::super::phases::back_to(me, before, 0, || true, "this process after the dead ring peers").await?;
        took.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Ok(format!(
            "{} ring peers stopped reading ({filled} messages filled a ring) and were SIGKILLed: every blocked send \
             failed PeerGone, p50 {:.1} ms / max {:.1} ms after the death (target 100 ms); fds and memfd mappings back",
            took.len(),
            ms(took[took.len() / 2]),
            ms(*took.last().unwrap_or(&Duration::ZERO)),
        ))
    }

    /// How long one send of the fill waits for room before it counts the ring as full.
    const FILL_WAIT: Duration = Duration::from_millis(50);
}
