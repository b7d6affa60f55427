//! What the store's integration tests share (each test binary uses its part of it).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{Channel, Endpoint, InlineChannel};
use ferry_local::LocalTransport;
use ferry_rpc::Client;
use ferry_rpc::remote::TensorRef;
use ferry_store::rpc::placement::RefPlacement;
use serde_json::json;

/// An endpoint on local sockets with `channel`, and the inline channel beside it.
pub fn endpoint(channel: Arc<dyn Channel>) -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(channel)
        .channel(Arc::new(InlineChannel))
        .build()
}

/// Where the store says `r` is.
pub async fn where_is(c: &Client, r: &TensorRef) -> RefPlacement {
    c.call("store.ref.placement", &json!({ "id": r.0.id })).await.unwrap()
}

/// Waits (bounded) until `f` holds of `r`'s placement.
pub async fn until(c: &Client, r: &TensorRef, what: &str, f: impl Fn(&RefPlacement) -> bool) -> RefPlacement {
    for _ in 0..1000 {
        let p = where_is(c, r).await;
        if f(&p) {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not after 10 s: {:?}", where_is(c, r).await);
}
