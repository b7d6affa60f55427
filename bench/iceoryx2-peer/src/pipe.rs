//! Round trips through ferry's own API, `Pipe` (the rows that say what a user gets): the
//! client and the peer each call `send_blocking` / `recv_blocking` on a plain thread
//! (issue 22's blocking fast path), over the same-host ring with spinning on and off, and
//! over the bare socket; and the async `send` / `recv` over the socket (the path every
//! pipe took before the ring).
//!
//! What a round trip carries ([`Load`]): a u8[64] tensor and nothing else (the 64 bytes
//! the ring and iceoryx2 rows carry); the same with a small JSON header, to show what a
//! header costs; a 24.9 MB f32[1920,1080,3] tensor made in the shm pool that the peer
//! sends back (the zero-copy handoff); and the same on the heap, copied into the pool on the
//! way out (one copy; back by reference). The timer brackets `send` and the `recv` of the
//! answer, as the iceoryx2 row brackets its send and receive: the message is made before
//! (a clone of one made once; making it is the caller's work, not the pipe's).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{Channel, DType, Endpoint, InlineChannel, Message, Tensor, TensorMeta};
use ferry_local::LocalTransport;
use ferry_ring::{RingExt, RingOptions};
use ferry_shm::ShmChannel;

use crate::{Res, finish, spawn};

/// How a case's pipe moves frames.
#[derive(Clone, Copy, Debug)]
pub enum Path {
    /// The ring, with this spin window on both sides; blocking calls.
    Ring(Duration),
    /// The socket; blocking calls.
    SocketBlocking,
    /// The socket; async calls from a task.
    SocketAsync,
}

impl Path {
    fn arg(self) -> String {
        match self {
            Path::Ring(spin) => spin.as_nanos().to_string(),
            Path::SocketBlocking | Path::SocketAsync => "none".into(),
        }
    }

    fn ring(arg: &str) -> Res<Option<RingOptions>> {
        Ok(match arg {
            "none" => None,
            n => Some(RingOptions::new().spin(Duration::from_nanos(n.parse()?))),
        })
    }
}

fn endpoint(ring: Option<RingOptions>) -> Endpoint {
    let channels: [Arc<dyn Channel>; 2] = [Arc::new(ShmChannel::new()), Arc::new(InlineChannel)];
    let mut b = Endpoint::builder().transport(Arc::new(LocalTransport::new()));
    for c in channels {
        b = b.channel(c);
    }
    b.ring(ring).build()
}

fn runtime() -> Res<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// What each round trip carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// A u8[64] tensor, no header (`null`).
    Bytes64,
    /// A u8[64] tensor and the header `{"bench":"64B"}` (as `ferry bench` sends).
    Bytes64Header,
    /// A 24.9 MB f32 tensor made in the shm pool, no header: it goes to the peer and comes
    /// back by reference.
    Pool,
    /// A 24.9 MB f32 tensor on the heap, no header: copied into the shm pool on the way
    /// out (one copy), back by reference.
    Heap,
}

/// A u8[64] tensor with `header`.
fn small(header: serde_json::Value) -> Res<Message> {
    let t = Tensor::from_slice(vec![64], &[7u8; 64])?;
    Ok(Message::with_tensors(header, vec![t]))
}

/// Times `iters` round trips of `load` over `path`, after a tenth as many untimed.
pub fn rtt(path: Path, load: Load, iters: usize) -> Res<Vec<Duration>> {
    let big = load == Load::Pool;
    let heap = load == Load::Heap;
    let rt = runtime()?;
    let addr = format!("unix:ferry-bench-ring-{}-{}", std::process::id(), crate::next());
    let (child, sock) = spawn("pipe", &format!("{addr} {}", path.arg()))?;
    let mut ready = [0u8; 1];
    std::io::Read::read_exact(&mut &sock, &mut ready)?;
    let pipe = rt.block_on(endpoint(Path::ring(&path.arg())?).connect(&addr))?;
    let ringed = pipe.info().features.iter().any(|f| f == "ring");
    if ringed != matches!(path, Path::Ring(_)) {
        return Err(format!("{path:?}: the pipe has ring {ringed}").into());
    }
    let msg = if big {
        let meta = TensorMeta::new(DType::F32, vec![1920, 1080, 3]);
        let mut t = rt.block_on(pipe.alloc(meta))?;
        t.as_bytes_mut().fill(1);
        Message::with_tensors(serde_json::Value::Null, vec![t.freeze()])
    } else if heap {
        let data = vec![1.0f32; 1920 * 1080 * 3];
        let t = Tensor::from_slice(vec![1920u64, 1080, 3], &data)?;
        Message::with_tensors(serde_json::Value::Null, vec![t])
    } else if load == Load::Bytes64Header {
        small(serde_json::json!({"bench": "64B"}))?
    } else {
        small(serde_json::Value::Null)?
    };
    let want = msg.tensors[0].as_bytes().as_ptr() as usize;
    let check = |back: &Message| -> Res<()> {
        if big && back.tensors[0].as_bytes().as_ptr() as usize != want {
            return Err("the tensor came back copied".into());
        }
        Ok(())
    };
    let mut times = Vec::with_capacity(iters);
    if let Path::SocketAsync = path {
        // One task does the whole loop, as an async program would.
        rt.block_on(async {
            for i in 0..iters + iters / 10 {
                let m = msg.clone();
                let t = Instant::now();
                pipe.send(m).await?;
                let back = pipe.recv().await?;
                let took = t.elapsed();
                check(&back)?;
                if i >= iters / 10 {
                    times.push(took);
                }
            }
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
    } else {
        for i in 0..iters + iters / 10 {
            let m = msg.clone();
            let t = Instant::now();
            pipe.send_blocking(m)?;
            let back = pipe.recv_blocking(Some(crate::BOUND))?;
            let took = t.elapsed();
            check(&back)?;
            if i >= iters / 10 {
                times.push(took);
            }
        }
    }
    drop(msg);
    rt.block_on(pipe.close());
    finish(child, sock)?;
    Ok(times)
}

/// The peer: accepts one pipe at `ADDR` and echoes every message on a plain thread with
/// the blocking calls until the pipe ends (or the benchmark's socket does).
pub fn peer(arg: &str, sock: std::os::unix::net::UnixStream) -> Res<()> {
    let (addr, ring) = arg.split_once(' ').ok_or("pipe peer: ADDR RING")?;
    let rt = runtime()?;
    let mut listener = rt.block_on(endpoint(Path::ring(ring)?).listen(addr))?;
    std::io::Write::write_all(&mut &sock, b"r")?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut &sock, &mut std::io::sink());
        std::process::exit(0);
    });
    let pipe = rt.block_on(listener.accept())?;
    loop {
        match pipe.recv_blocking(None) {
            Ok(m) => pipe.send_blocking(m)?,
            Err(_) => return Ok(()),
        }
    }
}
