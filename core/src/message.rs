//! [`Message`]: what a [`crate::Pipe`] carries.

use crate::tensor::Tensor;

/// One JSON header plus any number of tensors (a model's weights are one message).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The application's JSON value.
    pub header: serde_json::Value,
    /// The tensors, in order.
    pub tensors: Vec<Tensor>,
}

impl Message {
    /// A message with a header and no tensors.
    pub fn new(header: serde_json::Value) -> Self {
        Message { header, tensors: Vec::new() }
    }

    /// A message with a header and tensors.
    pub fn with_tensors(header: serde_json::Value, tensors: Vec<Tensor>) -> Self {
        Message { header, tensors }
    }

    /// Total tensor bytes.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes() as u64).sum()
    }
}
