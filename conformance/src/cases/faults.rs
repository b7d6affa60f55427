//! Fault cases: a peer process killed with SIGKILL is noticed within a second.

use std::time::{Duration, Instant};

use ferry_core::{Message, PipeError};
use serde_json::json;

use crate::peer::{self, role};
use crate::util::fail;
use crate::{Fixture, Outcome, Peers, ensure, run_async};

const LIMIT: Duration = Duration::from_secs(60);
const NOTICE: Duration = Duration::from_secs(1);

fn closed(r: &Result<Message, PipeError>) -> bool {
    matches!(r, Err(e) if e.is_closed())
}

/// The client process writes half a message frame and is killed: the server's `recv`
/// returns `Closed` within a second, and the half message is not delivered.
pub fn peer_dies_mid_message<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("dies-mid");
        let mut listener = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let mut child = peer::spawn::<F>(Peers::Processes, role::DIE_MID_MESSAGE, &addr).await?;
        let pipe = listener.accept().await.map_err(fail("accept"))?;
        ensure!(pipe.info().conn.peer_pid.is_none() || pipe.info().conn.peer_pid == child.pid(), "peer pid mismatch");
        let start = Instant::now();
        child.kill();
        let r = pipe.recv_timeout(NOTICE).await;
        ensure!(closed(&r), "after SIGKILL mid-message, recv gave {r:?} after {:?}", start.elapsed());
        let r = pipe.recv_timeout(NOTICE).await;
        ensure!(matches!(r, Err(PipeError::Closed)), "second recv gave {r:?}");
        Ok(())
    })
}

/// An idle client process is killed: the server notices within a second and its sends fail.
pub fn client_dies_idle<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("dies-idle");
        let mut listener = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let mut child = peer::spawn::<F>(Peers::Processes, role::IDLE_CLIENT, &addr).await?;
        let pipe = listener.accept().await.map_err(fail("accept"))?;
        let pending = tokio::spawn(async move {
            let r = pipe.recv().await;
            (r, pipe)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let start = Instant::now();
        child.kill();
        let (r, pipe) = tokio::time::timeout(NOTICE, pending)
            .await
            .map_err(|_| "pending recv did not fail within a second of SIGKILL")?
            .map_err(|e| format!("task: {e}"))?;
        ensure!(closed(&r), "pending recv gave {r:?} after {:?}", start.elapsed());
        let mut sent = Ok(());
        for i in 0..100 {
            sent = pipe.send(Message::new(json!(i))).await;
            if sent.is_err() {
                break;
            }
        }
        ensure!(matches!(sent, Err(ref e) if e.is_closed()), "send to a dead peer gave {sent:?}");
        Ok(())
    })
}

/// The server process is killed while the client waits in `recv`: it fails within a second.
pub fn server_dies_during_recv<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("server-dies");
        let mut server = peer::spawn::<F>(Peers::Processes, role::ECHO, &addr).await?;
        let pipe = fx.endpoint().build().connect(&addr).await.map_err(fail("connect"))?;
        pipe.send(Message::new(json!("ping"))).await.map_err(fail("send"))?;
        let m = pipe.recv_timeout(Duration::from_secs(10)).await.map_err(fail("recv"))?;
        ensure!(m.header == json!("ping"), "echo broken");
        let pending = tokio::spawn(async move { pipe.recv().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.kill();
        let r = tokio::time::timeout(NOTICE, pending)
            .await
            .map_err(|_| "pending recv did not fail within a second of SIGKILL")?
            .map_err(|e| format!("task: {e}"))?;
        ensure!(closed(&r), "pending recv gave {r:?}");
        Ok(())
    })
}
