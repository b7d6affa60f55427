//! The inline channel: tensor bytes travel inside the message frame's payload. Works over
//! every transport; the fallback when nothing faster is shared.

use std::sync::Arc;

use async_trait::async_trait;

use crate::channel::{Channel, ChannelSession, Incoming, Outgoing, SessionCtx};
use crate::dtype::{Device, DeviceKind};
use crate::error::ChannelError;
use crate::meta::TensorMeta;
use crate::tensor::{Storage, Tensor};
use crate::transport::ConnInfo;
use crate::wire::{ChannelOffer, Location};

/// The inline channel (name `"inline"`, CPU tensors).
#[derive(Debug, Default, Clone, Copy)]
pub struct InlineChannel;

impl Channel for InlineChannel {
    fn name(&self) -> &'static str {
        "inline"
    }
    fn devices(&self) -> &'static [DeviceKind] {
        &[DeviceKind::Cpu]
    }
    fn offer(&self, _: &ConnInfo) -> Option<ChannelOffer> {
        Some(ChannelOffer { name: "inline".into(), devices: vec![DeviceKind::Cpu], domain: Default::default() })
    }
    fn accepts(&self, offer: &ChannelOffer, _: &ConnInfo) -> bool {
        offer.name == "inline"
    }
    fn open(&self, _: SessionCtx) -> Result<Arc<dyn ChannelSession>, ChannelError> {
        Ok(Arc::new(InlineSession))
    }
}

/// A pipe's inline session (stateless).
#[derive(Debug)]
pub struct InlineSession;

#[async_trait]
impl ChannelSession for InlineSession {
    fn name(&self) -> &'static str {
        "inline"
    }

    async fn encode(&self, tensor: &Tensor, out: &mut Outgoing) -> Result<Location, ChannelError> {
        encode_inline(tensor, out)
    }

    fn encode_now(&self, tensor: &Tensor, out: &mut Outgoing) -> Option<Result<Location, ChannelError>> {
        Some(encode_inline(tensor, out))
    }

    fn decode_now(
        &self,
        meta: TensorMeta,
        loc: &Location,
        incoming: &mut Incoming,
    ) -> Option<Result<Tensor, ChannelError>> {
        Some(decode_inline(meta, loc, incoming))
    }

    async fn decode(&self, meta: TensorMeta, loc: &Location, incoming: &mut Incoming) -> Result<Tensor, ChannelError> {
        decode_inline(meta, loc, incoming)
    }
}

/// Encodes a host tensor inline.
fn encode_inline(tensor: &Tensor, out: &mut Outgoing) -> Result<Location, ChannelError> {
    if tensor.device() != Device::Cpu {
        return Err(ChannelError::Unsupported {
            channel: "inline",
            reason: format!("tensor is on {}", tensor.device()),
        });
    }
    let Storage::Host(bytes) = tensor.storage() else {
        return Err(ChannelError::Unsupported { channel: "inline", reason: "tensor is not in host memory".into() });
    };
    Ok(Location::Inline(out.push_payload(bytes.clone())))
}

/// Decodes an inline tensor (shared with channels that send small tensors inline).
pub fn decode_inline(meta: TensorMeta, loc: &Location, incoming: &mut Incoming) -> Result<Tensor, ChannelError> {
    let Location::Inline(r) = loc else {
        return Err(ChannelError::BadDescriptor { channel: "inline", reason: format!("unexpected location {loc:?}") });
    };
    if meta.device != Device::Cpu {
        return Err(ChannelError::BadDescriptor {
            channel: "inline",
            reason: format!("inline tensor claims device {}", meta.device),
        });
    }
    let bytes = incoming.slice(*r).ok_or_else(|| ChannelError::BadDescriptor {
        channel: "inline",
        reason: format!(
            "range offset {} + len {} is outside the payload of {} bytes",
            r.offset,
            r.len,
            incoming.payload().len()
        ),
    })?;
    Ok(Tensor::new(meta, bytes)?)
}
