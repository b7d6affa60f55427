//! `ferry bench` rows of the cuda-ipc channel (feature `cuda-ipc`), measured only where the
//! channel is viable: each benchmark tensor (default f32 `[1920,1080,3]`) as a CUDA tensor
//! in the pipe's exportable pool, to the echo peer process and back. The peer receives a
//! mapping of this process's memory and sends it back by reference, so a round trip moves
//! descriptors and events only (zero copy both ways).

use crate::self_exe::SelfExe;
use std::sync::Arc;

use anyhow::{Context, bail};
use ferry_core::{Channel, Device, DeviceKind, Endpoint, InlineChannel, Message, Tensor};
use ferry_cuda_ipc::CudaIpcChannel;
use indicatif::ProgressBar;

use super::{BenchOptions, Row, Size, filled, row, time_round_trips};

/// A note for the user, shown whether or not the progress bar is.
fn note(bar: &ProgressBar, msg: String) {
    if bar.is_hidden() { eprintln!("{msg}") } else { bar.println(msg) }
}

/// The rows, or none (with a note) where cuda-ipc cannot run or was not asked for.
pub(super) async fn rows(
    exe: &SelfExe,
    opts: &BenchOptions,
    sizes: &[Size],
    bar: &ProgressBar,
) -> anyhow::Result<Vec<Row>> {
    let chan = CudaIpcChannel::new();
    if !opts.only.is_empty() && !opts.only.iter().any(|o| o == "cuda-ipc") {
        return Ok(Vec::new());
    }
    if let Err(e) = chan.viability() {
        note(bar, format!("skipping cuda-ipc: {e}"));
        return Ok(Vec::new());
    }
    let Some(unix) = ferry::transports().into_iter().find(|t| t.scheme() == "unix") else {
        note(bar, "skipping cuda-ipc: it needs the `local` feature (unix sockets)".into());
        return Ok(Vec::new());
    };
    let addr = format!("unix:ferry-bench-cuda-{}", std::process::id());
    let _peer = crate::bench::start_echo_peer(exe, &addr)?;
    let ep = Endpoint::builder()
        .transport(unix.clone())
        .channel(Arc::new(chan.clone()) as Arc<dyn Channel>)
        .channel(Arc::new(InlineChannel))
        .build();
    let pipe = ep.connect(&addr).await.context("connecting for cuda-ipc")?;
    if pipe.info().channels.get(&DeviceKind::Cuda).map(String::as_str) != Some("cuda-ipc") {
        note(bar, format!("skipping cuda-ipc: the peer did not agree to it ({:?})", pipe.info().channels));
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for s in sizes {
        bar.set_message(format!("{} / cuda-ipc: {}", unix.name(), s.label));
        let host = filled(s.meta.clone())?;
        let t: Tensor = pipe.alloc_device(s.meta.clone().with_device(Device::Cuda(0))).await?;
        chan.copy_from_host(&t, host.as_bytes())?;
        let msg = Message::with_tensors(serde_json::json!({"bench": "cuda"}), vec![t.clone()]);
        pipe.send(msg.clone()).await?;
        let back = pipe.recv().await?;
        if back.tensors[0] != t || chan.copy_to_host(&back.tensors[0])? != host.as_bytes() {
            bail!("cuda-ipc: the tensor came back different");
        }
        drop(back);
        time_round_trips(&pipe, &msg, opts.warmup, bar).await?;
        let smp = time_round_trips(&pipe, &msg, s.iters, bar).await?;
        let bytes = s.meta.byte_span()?;
        out.push(row(unix.name(), "cuda-ipc", "rtt-zero-copy", format!("{} cuda", s.label), bytes, 2.0, smp));
    }
    pipe.close().await;
    Ok(out)
}
