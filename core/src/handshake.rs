//! The handshake as plain functions (sans-IO): what the client offers and what the server
//! chooses. The server's choice is authoritative; the client never recomputes it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::channel::Channel;
use crate::compact::FEATURES;
use crate::dtype::DeviceKind;
use crate::transport::ConnInfo;
use crate::wire::{Hello, Limits, PROTOCOL, Refusal, Welcome};

/// The agent string this build sends.
pub fn agent() -> String {
    format!("ferry-rust/{}", env!("CARGO_PKG_VERSION"))
}

/// Builds the client's HELLO: every viable channel that can work over `conn`, in priority
/// order.
pub fn client_hello(
    channels: &[Arc<dyn Channel>],
    conn: &ConnInfo,
    version: u16,
    token: Option<String>,
    limits: Limits,
) -> Hello {
    Hello {
        protocol: PROTOCOL.into(),
        version,
        channels: channels.iter().filter(|c| c.viability().is_ok()).filter_map(|c| c.offer(conn)).collect(),
        token,
        agent: agent(),
        limits: Some(limits),
        features: FEATURES.iter().map(|f| (*f).to_string()).collect(),
    }
}

/// The server's decision: for each device kind, its highest-priority viable channel that the
/// client offered and that accepts the client's offer. CPU tensors must have a channel.
pub fn server_choose(
    channels: &[Arc<dyn Channel>],
    hello: &Hello,
    conn: &ConnInfo,
    version: u16,
    limits: Limits,
) -> Result<Welcome, Refusal> {
    if hello.protocol != PROTOCOL {
        return Err(Refusal::Malformed { detail: format!("protocol is {:?}, expected {PROTOCOL:?}", hello.protocol) });
    }
    if hello.version != version {
        return Err(Refusal::VersionMismatch { server: version, client: hello.version });
    }
    let mut chosen = BTreeMap::new();
    for kind in [DeviceKind::Cpu, DeviceKind::Cuda] {
        let pick = channels.iter().filter(|c| c.devices().contains(&kind) && c.viability().is_ok()).find(|c| {
            hello.channels.iter().any(|o| o.name == c.name() && o.devices.contains(&kind) && c.accepts(o, conn))
        });
        if let Some(c) = pick {
            chosen.insert(kind, c.name().to_string());
        }
    }
    if !chosen.contains_key(&DeviceKind::Cpu) {
        return Err(Refusal::NoCommonChannel {
            offered: hello.channels.iter().map(|o| o.name.clone()).collect(),
            supported: channels.iter().map(|c| c.name().to_string()).collect(),
        });
    }
    let features =
        FEATURES.iter().filter(|f| hello.features.iter().any(|h| h == *f)).map(|f| (*f).to_string()).collect();
    Ok(Welcome { version, channels: chosen, limits, agent: agent(), features })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inline::InlineChannel;

    #[test]
    fn negotiation() {
        let chans: Vec<Arc<dyn Channel>> = vec![Arc::new(InlineChannel)];
        let conn = ConnInfo::default();
        let hello = client_hello(&chans, &conn, 1, None, Limits::default());
        let w = server_choose(&chans, &hello, &conn, 1, Limits::default()).unwrap();
        assert_eq!(w.channels[&DeviceKind::Cpu], "inline");
        assert!(!w.channels.contains_key(&DeviceKind::Cuda));

        let r = server_choose(&chans, &hello, &conn, 2, Limits::default()).unwrap_err();
        assert_eq!(r, Refusal::VersionMismatch { server: 2, client: 1 });

        let none = Hello { channels: vec![], ..hello.clone() };
        let r = server_choose(&chans, &none, &conn, 1, Limits::default()).unwrap_err();
        assert!(matches!(r, Refusal::NoCommonChannel { .. }), "{r}");
        assert!(r.to_string().contains("server supports [inline]"), "{r}");

        let odd = Hello { protocol: "http".into(), ..hello };
        assert!(matches!(server_choose(&chans, &odd, &conn, 1, Limits::default()), Err(Refusal::Malformed { .. })));
    }
}
