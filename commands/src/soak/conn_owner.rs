//! The soak's per-connection identity phase (issue 43, point 5): many short-lived QUIC
//! connections without a token (each its own identity) to a `ferry serve-weights` with a
//! placement disk tier, each keeping references (some written to the disk tier), publishing
//! a bundle and closing. Nothing may outlive its connection: were references kept, the
//! later connections would hit `max_refs`; were bundles kept, the store's budget (a few
//! bundles) would refuse them. At the end the store lists nothing, the disk tier holds no
//! file, and the server's descriptors are back to idle. Connections a second are reported.

#[cfg(feature = "quic")]
pub(super) use imp::tokenless_quic_connections;

/// Without QUIC there is no per-connection identity to soak.
#[cfg(not(feature = "quic"))]
pub(super) async fn tokenless_quic_connections(_: &mut super::Ctx) -> anyhow::Result<String> {
    Ok("skipped: this ferry was built without the `quic` feature".into())
}

#[cfg(feature = "quic")]
mod imp {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    use anyhow::{Context, bail, ensure};
    use ferry_rpc::codes::FORBIDDEN;
    use ferry_rpc::remote::TensorRef;
    use ferry_rpc::{Client, RpcTensor};
    use serde_json::{Value, json};

    use super::super::phases::back_to;
    use super::super::{Ctx, usage};

    /// References each connection keeps (64 KiB each).
    const REFS: usize = 16;
    /// Bytes of each connection's bundle; the store's budget holds [`BUDGET_MIB`] MiB.
    const BUNDLE: usize = 1 << 20;
    const BUDGET_MIB: &str = "16";
    /// Connections open at once.
    const AT_ONCE: usize = 8;

    /// The server child, killed on drop.
    struct Server(std::process::Child);

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn tensor(bytes: usize, v: u8) -> anyhow::Result<RpcTensor> {
        Ok(RpcTensor(ferry_core::Tensor::from_slice(vec![bytes as u64], &vec![v; bytes])?))
    }

    /// One connection's life: references, one refused publish, a bundle, then the close.
    async fn one(addr: &str, i: usize) -> anyhow::Result<()> {
        let pipe = tokio::time::timeout(Duration::from_secs(20), ferry::endpoint().build().connect(addr))
            .await
            .context("connecting: timed out")??;
        let c = Client::new(pipe).with_timeout(Some(Duration::from_secs(60)));
        let mut first = None;
        for k in 0..REFS {
            let r: TensorRef = c
                .call("ferry.ref.keep", &json!({ "tensor": tensor(64 << 10, k as u8)? }))
                .await
                .with_context(|| format!("connection {i}: keeping reference {k}"))?;
            first.get_or_insert(r);
        }
        let id = first.map(|r| r.0.id).unwrap_or_default();
        let e = c.call::<_, Value>("ferry.ref.publish", &json!({ "id": id })).await;
        ensure!(
            matches!(&e, Err(e) if e.code() == Some(FORBIDDEN)),
            "connection {i}: publishing a reference without a token was not FORBIDDEN: {e:?}"
        );
        let name = format!("soak-{i}");
        c.call::<_, Value>("store.publish", &json!({ "name": name, "tensors": { "w": tensor(BUNDLE, 1)? } }))
            .await
            .with_context(|| format!("connection {i}: publishing its bundle"))?;
        c.close().await;
        Ok(())
    }

    pub(crate) async fn tokenless_quic_connections(ctx: &mut Ctx) -> anyhow::Result<String> {
        let n = if ctx.counts.full { 1000 } else { 48 };
        let tmp = std::env::temp_dir().join(format!("ferry-soak-owner-{}", std::process::id()));
        let (home, disk) = (tmp.join("home"), tmp.join("disk"));
        std::fs::create_dir_all(&home)?;
        let mut child = ctx
            .exe
            .command()
            .args(["serve-weights", "--name", "soak", "--addr", "quic://127.0.0.1:0", "--budget-mib", BUDGET_MIB])
            .args(["--placement", "lru", "--cpu-budget-mib", "4", "--disk-dir"])
            .arg(&disk)
            .env("XDG_CONFIG_HOME", &home)
            .env_remove("FERRY_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting ferry serve-weights")?;
        let out = child.stdout.take().context("its stdout")?;
        let server = Server(child);
        let line = tokio::task::spawn_blocking(move || {
            let mut l = String::new();
            BufReader::new(out).read_line(&mut l).map(|_| l)
        })
        .await??;
        let Some(addr) = line.trim().strip_prefix("listening on ").map(str::to_owned) else {
            bail!("ferry serve-weights said {line:?}");
        };
        let pid = server.0.id();
        // One connection first, so that the idle figures include what a first one sets up.
        one(&addr, usize::MAX).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let idle = usage(pid);
        let started = Instant::now();
        let mut done = 0;
        while done < n {
            let batch = AT_ONCE.min(n - done);
            let mut set = tokio::task::JoinSet::new();
            for i in done..done + batch {
                let addr = addr.clone();
                set.spawn(async move { one(&addr, i).await });
            }
            while let Some(r) = set.join_next().await {
                r??;
            }
            done += batch;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        // Everything the connections made is gone once the server has seen them close.
        let disk_empty = || std::fs::read_dir(&disk).map(|d| d.count()).unwrap_or(usize::MAX) == 0;
        back_to(pid, idle, 0, disk_empty, "the server (or its disk tier) after the connections closed").await?;
        let last = tokio::time::timeout(Duration::from_secs(20), ferry::endpoint().build().connect(&addr)).await??;
        let c = Client::new(last).with_timeout(Some(Duration::from_secs(60)));
        let bundles: Vec<Value> = c.call("store.list", &json!({})).await?;
        ensure!(bundles.is_empty(), "bundles outlived their connections: {bundles:?}");
        c.close().await;
        let end = usage(pid);
        drop(server);
        let _ = std::fs::remove_dir_all(&tmp);
        Ok(format!(
            "{n} tokenless QUIC connections ({AT_ONCE} at once, {rate:.0}/s), each {REFS} refs + a 1 MiB bundle \
             (budget {BUDGET_MIB} MiB): none outlived its connection (store empty, disk tier empty, fds {} -> {}); \
             server RSS {:.1} -> {:.1} MiB",
            idle.fds,
            end.fds,
            idle.rss_kib as f64 / 1024.0,
            end.rss_kib as f64 / 1024.0,
        ))
    }
}
