//! Checkpoint files published through a `TensorCodec` (`weights::publish_files`,
//! `publish_safetensors`): the tensors come back equal, they lie in the version's buckets
//! (the codec sliced them out of the file image, no second copy), and the metadata names
//! the files and the codec.

use std::path::PathBuf;

use bytes::Bytes;
use ferry_core::{DType, RawCodec, SafetensorsCodec, Tensor, TensorCodec, TensorMeta};
use ferry_store::{Store, StoreOptions, weights};

fn tensors(n: usize) -> Vec<(String, Tensor)> {
    (0..n)
        .map(|i| {
            let len = 1000 + 64 * i;
            let meta = TensorMeta::new(DType::F32, vec![len as u64]);
            let bytes: Vec<u8> = (0..len * 4).map(|b| (b * 7 + i) as u8).collect();
            (format!("layers.{i}.weight"), Tensor::new(meta, Bytes::from(bytes)).unwrap())
        })
        .collect()
}

fn write(dir: &tempfile::TempDir, file: &str, codec: &dyn TensorCodec, t: &[(String, Tensor)]) -> PathBuf {
    let mut buf = Vec::new();
    codec.encode(t, &mut buf).unwrap();
    let path = dir.path().join(file);
    std::fs::write(&path, buf).unwrap();
    path
}

fn in_buckets(v: &ferry_store::Version, t: &Tensor) -> bool {
    let p = t.as_bytes().as_ptr() as usize;
    v.bucket_tensors().iter().any(|b| {
        let start = b.as_bytes().as_ptr() as usize;
        p >= start && p + t.nbytes() <= start + b.nbytes()
    })
}

#[test]
fn checkpoints_are_published_through_their_codec_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let all = tensors(6);
    let st = write(&dir, "a.safetensors", &SafetensorsCodec, &all[..3]);
    let raw = write(&dir, "b.ferry", &RawCodec, &all[3..]);
    let store = Store::new(StoreOptions { budget_bytes: 1 << 30, ..StoreOptions::default() });

    let mut seen = 0;
    let v =
        weights::publish_safetensors(&store, "st", std::slice::from_ref(&st), serde_json::Value::Null, &mut |d, _| {
            seen = d
        })
        .unwrap();
    assert_eq!(seen, std::fs::metadata(&st).unwrap().len());
    let mut got = v.tensors();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, all[..3]);
    assert!(got.iter().all(|(_, t)| in_buckets(&v, t)), "the tensors are views of the buckets");
    assert_eq!(v.manifest().metadata["format"], "safetensors");
    assert_eq!(v.manifest().metadata["files"], serde_json::json!(["a.safetensors"]));

    let v = weights::publish_files(
        &store,
        "raw",
        std::slice::from_ref(&raw),
        &RawCodec,
        serde_json::json!({"step": 3}),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(v.tensors(), all[3..]);
    assert!(v.tensors().iter().all(|(_, t)| in_buckets(&v, t)));
    assert_eq!(v.manifest().metadata["format"], "raw");
    assert_eq!(v.manifest().metadata["step"], 3);

    // A file the codec cannot read is refused with the file's name; so is a name in two files.
    let e = weights::publish_files(
        &store,
        "bad",
        std::slice::from_ref(&raw),
        &SafetensorsCodec,
        serde_json::Value::Null,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("b.ferry"), "{e}");
    let twice = write(&dir, "c.safetensors", &SafetensorsCodec, &all[..1]);
    let e = weights::publish_safetensors(&store, "twice", &[st, twice], serde_json::Value::Null, &mut |_, _| {})
        .unwrap_err();
    assert!(e.to_string().contains("is in both"), "{e}");
}

#[test]
fn a_safetensors_file_naming_a_tensor_twice_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let all = tensors(2);
    let path = write(&dir, "dup.safetensors", &SafetensorsCodec, &all);
    // The same header with the second name made the first (same length, so offsets hold).
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(17).position(|w| w == b"\"layers.1.weight\"").unwrap();
    bytes[at + 8] = b'0';
    std::fs::write(&path, bytes).unwrap();
    let store = Store::new(StoreOptions { budget_bytes: 1 << 30, ..StoreOptions::default() });
    let e = weights::publish_safetensors(&store, "dup", &[path], serde_json::Value::Null, &mut |_, _| {}).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("dup.safetensors") && text.contains("\"layers.0.weight\" twice"), "{text}");
    assert!(store.open("dup", None).is_err(), "nothing was published");
}
