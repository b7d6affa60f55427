//! [`TensorMeta`]: dtype, shape, strides and device, with checked size arithmetic.
//!
//! Every number here may come from a hostile peer. Nothing in this module panics or
//! overflows: [`TensorMeta::validate`] checks a description against the bytes really
//! present before any slice is made.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::dtype::{DType, Device};
use crate::error::MetaError;

/// The most dimensions a tensor may have (PyTorch allows 25, numpy 64).
pub const MAX_DIMS: usize = 64;

/// What a tensor is, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension; `[]` is a 0-d (scalar) tensor.
    pub shape: Vec<u64>,
    /// Strides in elements, one per dimension; absent means contiguous row-major.
    /// Negative strides are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strides: Option<Vec<i64>>,
    /// Where the bytes live.
    #[serde(default)]
    pub device: Device,
}

impl TensorMeta {
    /// A contiguous CPU tensor of `dtype` and `shape`.
    pub fn new(dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        TensorMeta { dtype, shape: shape.into(), strides: None, device: Device::Cpu }
    }

    /// Sets the strides (in elements).
    pub fn with_strides(mut self, strides: impl Into<Vec<i64>>) -> Self {
        self.strides = Some(strides.into());
        self
    }

    /// Sets the device.
    pub fn with_device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Number of elements (1 for a 0-d tensor), checked.
    pub fn numel(&self) -> Result<u64, MetaError> {
        self.check_dims()?;
        self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d).ok_or(MetaError::Overflow))
    }

    /// Number of bytes the tensor's storage must hold, checked. For a contiguous tensor this
    /// is `numel * itemsize`; with strides it is the span from the first to the last element.
    pub fn byte_span(&self) -> Result<u64, MetaError> {
        let numel = self.numel()?;
        let item = self.dtype.itemsize() as u64;
        let Some(strides) = &self.strides else {
            return numel.checked_mul(item).ok_or(MetaError::Overflow);
        };
        if strides.len() != self.shape.len() {
            return Err(MetaError::StridesMismatch { dims: self.shape.len(), strides: strides.len() });
        }
        for (dim, &s) in strides.iter().enumerate() {
            if s < 0 {
                return Err(MetaError::NegativeStride { dim, stride: s });
            }
        }
        if numel == 0 {
            return Ok(0);
        }
        let mut last = 0u64;
        for (&d, &s) in self.shape.iter().zip(strides) {
            // d >= 1 here because numel > 0; s >= 0 checked above.
            let step = (d - 1).checked_mul(s as u64).ok_or(MetaError::Overflow)?;
            last = last.checked_add(step).ok_or(MetaError::Overflow)?;
        }
        last.checked_add(1).and_then(|n| n.checked_mul(item)).ok_or(MetaError::Overflow)
    }

    /// True when the tensor is row-major contiguous (no strides, or strides equal to the
    /// row-major ones).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = &self.strides else { return true };
        if strides.len() != self.shape.len() {
            return false;
        }
        let mut expect = 1i64;
        for (&d, &s) in self.shape.iter().zip(strides).rev() {
            if d != 1 && s != expect {
                return false;
            }
            let Ok(d) = i64::try_from(d) else { return false };
            expect = match expect.checked_mul(d) {
                Some(e) => e,
                None => return false,
            };
        }
        true
    }

    /// Checks this description against `available` bytes of storage: dims, overflow,
    /// strides, and length. A contiguous tensor (no strides, or row-major strides) must
    /// match exactly; another strided one must fit.
    /// Returns the byte span on success.
    pub fn validate(&self, available: u64) -> Result<u64, MetaError> {
        let span = self.byte_span()?;
        // Row-major strides are the same tensor as no strides: exact match. Other strided
        // tensors (views) must fit.
        let fits = if self.is_contiguous() { span == available } else { span <= available };
        if !fits {
            return Err(MetaError::LengthMismatch { expected: span, actual: available });
        }
        Ok(span)
    }

    fn check_dims(&self) -> Result<(), MetaError> {
        if self.shape.len() > MAX_DIMS {
            return Err(MetaError::TooManyDims { dims: self.shape.len(), max: MAX_DIMS });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn contiguous_sizes() {
        let m = TensorMeta::new(DType::F32, vec![1920, 1080, 3]);
        assert_eq!(m.byte_span().unwrap(), 1920 * 1080 * 3 * 4);
        assert_eq!(TensorMeta::new(DType::F64, vec![]).byte_span().unwrap(), 8);
        assert_eq!(TensorMeta::new(DType::F64, vec![4, 0, 2]).byte_span().unwrap(), 0);
        assert!(m.validate(1920 * 1080 * 3 * 4).is_ok());
        assert_eq!(m.validate(5), Err(MetaError::LengthMismatch { expected: 1920 * 1080 * 3 * 4, actual: 5 }));
    }

    #[test]
    fn strided_sizes() {
        // A transposed 2x3 f32 view of 6 elements.
        let m = TensorMeta::new(DType::F32, vec![3, 2]).with_strides(vec![1, 3]);
        assert_eq!(m.byte_span().unwrap(), 24);
        assert!(!m.is_contiguous());
        assert!(TensorMeta::new(DType::F32, vec![2, 3]).with_strides(vec![3, 1]).is_contiguous());
        assert_eq!(m.validate(16), Err(MetaError::LengthMismatch { expected: 24, actual: 16 }));
        // Row-major strides must match exactly, like no strides (else typed views overrun).
        let rm = TensorMeta::new(DType::F32, vec![2]).with_strides(vec![1]);
        assert_eq!(rm.validate(16), Err(MetaError::LengthMismatch { expected: 8, actual: 16 }));
        assert!(matches!(
            TensorMeta::new(DType::U8, vec![2]).with_strides(vec![-1]).validate(2),
            Err(MetaError::NegativeStride { dim: 0, stride: -1 })
        ));
        assert!(matches!(
            TensorMeta::new(DType::U8, vec![2]).with_strides(vec![1, 1]).validate(2),
            Err(MetaError::StridesMismatch { .. })
        ));
    }

    #[test]
    fn hostile_sizes() {
        let m = TensorMeta::new(DType::F64, vec![u64::MAX, 2]);
        assert_eq!(m.validate(0), Err(MetaError::Overflow));
        let m = TensorMeta::new(DType::F64, vec![u64::MAX / 4]);
        assert_eq!(m.validate(0), Err(MetaError::Overflow));
        let m = TensorMeta::new(DType::U8, vec![3, 3]).with_strides(vec![i64::MAX, i64::MAX]);
        assert_eq!(m.validate(0), Err(MetaError::Overflow));
        let m = TensorMeta::new(DType::U8, vec![1; MAX_DIMS + 1]);
        assert!(matches!(m.validate(1), Err(MetaError::TooManyDims { .. })));
    }

    proptest! {
        #[test]
        fn no_metadata_panics(
            dtype in prop::sample::select(DType::ALL.to_vec()),
            shape in prop::collection::vec(any::<u64>(), 0..70),
            strides in prop::option::of(prop::collection::vec(any::<i64>(), 0..70)),
            available in any::<u64>(),
        ) {
            let m = TensorMeta { dtype, shape, strides, device: Device::Cpu };
            let _ = m.numel();
            let _ = m.is_contiguous();
            if let Ok(span) = m.validate(available) {
                prop_assert!(span <= available);
            }
        }

        #[test]
        fn small_shapes_agree(shape in prop::collection::vec(0u64..8, 0..5)) {
            let m = TensorMeta::new(DType::I16, shape.clone());
            let n: u64 = shape.iter().product();
            prop_assert_eq!(m.byte_span().unwrap(), n * 2);
            prop_assert!(m.validate(n * 2).is_ok());
        }

        #[test]
        fn hostile_json_never_panics(s in ".{0,200}") {
            let _ = serde_json::from_str::<TensorMeta>(&s);
        }
    }
}
