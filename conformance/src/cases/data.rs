//! Data cases: what goes in comes out, whole and in order.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_core::{DType, Message, PipeError, Tensor, TensorMeta};
use serde_json::json;

use crate::util::{RECV, compare, echo_pipe, fail, pattern, round_trip};
use crate::{Fixture, Outcome, Peers, ensure, run_async};

const LIMIT: Duration = Duration::from_secs(240);

/// One tensor of every dtype, each with its own shape, in one message.
pub fn every_dtype<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let (_peer, pipe) = echo_pipe(fx, mode, "every-dtype").await?;
        let tensors = DType::ALL.iter().enumerate().map(|(i, &d)| pattern(d, &[3, i as u64 + 1], i as u64)).collect();
        round_trip(&pipe, Message::with_tensors(json!({"case": "every_dtype"}), tensors)).await?;
        // And each alone, so a dtype cannot hide behind another's alignment.
        for (i, d) in DType::ALL.into_iter().enumerate() {
            round_trip(&pipe, Message::with_tensors(json!(i), vec![pattern(d, &[17], i as u64)])).await?;
        }
        Ok(())
    })
}

/// 0-d tensors (one element) and tensors with zero-size dimensions.
pub fn zero_d_and_empty<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let (_peer, pipe) = echo_pipe(fx, mode, "zero-d").await?;
        let tensors = vec![
            pattern(DType::F64, &[], 1),
            pattern(DType::Bool, &[], 2),
            pattern(DType::F32, &[0], 3),
            pattern(DType::I64, &[3, 0, 2], 4),
            pattern(DType::U8, &[0, 0], 5),
            pattern(DType::Bf16, &[], 6),
        ];
        let msg = Message::with_tensors(json!(null), tensors);
        ensure!(msg.tensors[0].nbytes() == 8 && msg.tensors[3].nbytes() == 0, "test tensors have wrong sizes");
        round_trip(&pipe, msg).await?;
        round_trip(&pipe, Message::new(json!({"no": "tensors"}))).await
    })
}

/// Strided tensors keep their strides (and only the bytes they span travel).
pub fn strided<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let (_peer, pipe) = echo_pipe(fx, mode, "strided").await?;
        let base = pattern(DType::F32, &[6], 9);
        let transposed = Tensor::new(TensorMeta::new(DType::F32, vec![3, 2]).with_strides(vec![1, 3]), base.bytes())
            .map_err(|e| format!("{e}"))?;
        let broadcast =
            Tensor::new(TensorMeta::new(DType::U16, vec![4, 5]).with_strides(vec![0, 1]), Bytes::from(vec![1u8; 10]))
                .map_err(|e| format!("{e}"))?;
        round_trip(&pipe, Message::with_tensors(json!("strided"), vec![transposed, broadcast])).await
    })
}

/// One-tensor messages from 0 bytes to 256 MiB.
pub fn payload_sizes<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let (_peer, pipe) = echo_pipe(fx, mode, "sizes").await?;
        for (i, n) in [0u64, 1, 63, 64, 65, 4095, 4096, 65_537, 1 << 20, 16 << 20, 256 << 20].into_iter().enumerate() {
            let t = pattern(DType::U8, &[n], i as u64 + 100);
            round_trip(&pipe, Message::with_tensors(json!({"bytes": n}), vec![t]))
                .await
                .map_err(|e| crate::Failed::from(format!("{n} bytes: {}", e.message().unwrap_or_default())))?;
        }
        Ok(())
    })
}

/// 1,000 tensors in one message.
pub fn many_tensors<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let (_peer, pipe) = echo_pipe(fx, mode, "many").await?;
        let tensors =
            (0..1000u64).map(|i| pattern(DType::ALL[(i % DType::ALL.len() as u64) as usize], &[i % 7, 3], i)).collect();
        round_trip(&pipe, Message::with_tensors(json!({"count": 1000}), tensors)).await
    })
}

/// 10,000 messages in flight keep their order.
pub fn order_10k<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let (_peer, pipe) = echo_pipe(fx, mode, "order").await?;
        let pipe = Arc::new(pipe);
        let sender = {
            let pipe = pipe.clone();
            tokio::spawn(async move {
                for i in 0..10_000u64 {
                    let t = Tensor::from_slice(vec![2], &[i, !i]).map_err(|e| e.to_string())?;
                    pipe.send(Message::with_tensors(json!({"seq": i}), vec![t])).await.map_err(|e| e.to_string())?;
                }
                Ok::<(), String>(())
            })
        };
        for i in 0..10_000u64 {
            let m = pipe.recv_timeout(RECV).await.map_err(fail("recv"))?;
            ensure!(m.header == json!({"seq": i}), "message {i} arrived as {}", m.header);
            let v = m.tensors.first().and_then(|t| t.as_slice::<u64>().ok()).unwrap_or(&[]);
            ensure!(v == [i, !i], "message {i} carries the wrong tensor {v:?}");
        }
        sender.await.map_err(|e| format!("sender task: {e}"))?.map_err(|e| format!("sender: {e}"))?;
        Ok(())
    })
}

/// 16 pipes to one peer at once, each with its own traffic.
pub fn sixteen_pipes<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("sixteen");
        let _peer = crate::peer::spawn::<F>(mode, crate::peer::role::ECHO, &addr).await?;
        let ep = fx.endpoint().build();
        let mut tasks = tokio::task::JoinSet::new();
        for p in 0..16u64 {
            let (ep, addr) = (ep.clone(), addr.clone());
            tasks.spawn(async move {
                let pipe = ep.connect(&addr).await.map_err(|e| format!("pipe {p}: connect: {e}"))?;
                for i in 0..40u64 {
                    let t = pattern(DType::I32, &[64, 64], p * 1000 + i);
                    let msg = Message::with_tensors(json!({"pipe": p, "i": i}), vec![t]);
                    round_trip(&pipe, msg).await.map_err(|e| format!("pipe {p} message {i}: {e:?}"))?;
                }
                Ok::<(), String>(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.map_err(|e| format!("task: {e}"))??;
        }
        Ok(())
    })
}

/// Four tasks sending on one pipe: every message arrives whole, each task's in order.
pub fn concurrent_senders<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let (_peer, pipe) = echo_pipe(fx, mode, "concurrent").await?;
        let pipe = Arc::new(pipe);
        let mut senders = tokio::task::JoinSet::new();
        for task in 0..4u64 {
            let pipe = pipe.clone();
            senders.spawn(async move {
                for i in 0..250u64 {
                    let t = pattern(DType::U8, &[1000 + task * 4096], task * 10_000 + i);
                    pipe.send(Message::with_tensors(json!({"task": task, "i": i}), vec![t])).await?;
                }
                Ok::<(), PipeError>(())
            });
        }
        let mut next = [0u64; 4];
        for _ in 0..1000 {
            let m = pipe.recv_timeout(RECV).await.map_err(fail("recv"))?;
            let task = m.header["task"].as_u64().unwrap_or(99);
            let i = m.header["i"].as_u64().unwrap_or(u64::MAX);
            ensure!(task < 4 && next[task as usize] == i, "task {task} message {i} out of order");
            next[task as usize] += 1;
            let want = pattern(DType::U8, &[1000 + task * 4096], task * 10_000 + i);
            compare(&Message::with_tensors(m.header.clone(), vec![want]), &m)?;
        }
        while let Some(r) = senders.join_next().await {
            r.map_err(|e| format!("task: {e}"))?.map_err(fail("send"))?;
        }
        Ok(())
    })
}

/// A 1 MiB JSON header with no tensors, and one beside a tensor.
pub fn big_header<F: Fixture>(fx: &F, mode: Peers) -> Outcome {
    run_async(LIMIT, async {
        let (_peer, pipe) = echo_pipe(fx, mode, "header").await?;
        let text = "ferry ".repeat(1 << 18);
        round_trip(&pipe, Message::new(json!({"text": text, "nested": [[[{"a": 1}]]], "unicode": "éü—🚢"}))).await?;
        round_trip(&pipe, Message::with_tensors(json!({"text": text}), vec![pattern(DType::F16, &[5], 5)])).await
    })
}

/// `close()` on one side: the other side's `recv` returns `Closed` promptly, and sends on
/// the closed side fail instead of hanging.
pub fn close_is_clean<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("close");
        let ep = fx.endpoint().build();
        let mut listener = ep.listen(&addr).await.map_err(fail("listen"))?;
        let client = ep.connect(&addr).await.map_err(fail("connect"))?;
        let server = listener.accept().await.map_err(fail("accept"))?;
        client.send(Message::new(json!("last words"))).await.map_err(fail("send"))?;
        client.close().await;
        let m = server.recv_timeout(RECV).await.map_err(fail("recv before close"))?;
        ensure!(m.header == json!("last words"), "message sent before close was lost");
        let r = server.recv_timeout(Duration::from_secs(1)).await;
        ensure!(matches!(r, Err(PipeError::Closed)), "after peer close, recv gave {r:?}");
        let r = client.send(Message::new(json!(1))).await;
        ensure!(matches!(r, Err(PipeError::Closed)), "send after close gave {r:?}");
        ensure!(client.is_closed() && server.is_closed(), "pipes not marked closed");
        Ok(())
    })
}
