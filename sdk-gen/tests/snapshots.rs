//! Data-driven snapshot tests: every `tests/data/NAME.json` (an OpenRPC document) is
//! generated as `tests/data/NAME.py`, `tests/data/NAME.js` and `tests/data/NAME.d.ts` and
//! compared with the files
//! checked in. Run with `UPDATE_EXPECT=1` to rewrite them after a deliberate change
//! (expect-test's convention), then review the diff.

use std::path::{Path, PathBuf};

use expect_test::expect_file;
use ferry_sdk_gen::Emitter;
use ferry_sdk_gen::ir::Api;
use ferry_sdk_gen::python::Python;
use ferry_sdk_gen::typescript::TypeScript;

fn inputs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut docs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "no inputs in {}", dir.display());
    docs
}

#[test]
fn generated_clients_match_the_snapshots() {
    for doc_path in inputs() {
        let stem = doc_path.file_stem().unwrap().to_str().unwrap().to_owned();
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&doc_path).unwrap()).unwrap();
        let api = Api::from_openrpc(&stem, &doc).unwrap();
        let py = Python.emit(&api);
        assert_eq!(py.len(), 1);
        assert_eq!(py[0].0, Path::new(&format!("{stem}.py")));
        expect_file![format!("data/{stem}.py")].assert_eq(&py[0].1);
        let ts = TypeScript { runtime: "ferry-client".into() }.emit(&api);
        assert_eq!(ts.len(), 2);
        assert_eq!(ts[0].0, Path::new(&format!("{stem}.js")));
        assert_eq!(ts[1].0, Path::new(&format!("{stem}.d.ts")));
        expect_file![format!("data/{stem}.js")].assert_eq(&ts[0].1);
        expect_file![format!("data/{stem}.d.ts")].assert_eq(&ts[1].1);
        // The same document gives the same bytes.
        assert_eq!(Python.emit(&Api::from_openrpc(&stem, &doc).unwrap()), py);
    }
}

#[test]
fn every_file_starts_with_the_preamble() {
    for doc_path in inputs() {
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&doc_path).unwrap()).unwrap();
        let api = Api::from_openrpc("x", &doc).unwrap();
        let py = &Python.emit(&api)[0].1;
        assert!(py.starts_with(&format!("# {}\n", ferry_sdk_gen::PREAMBLE)), "{py}");
        assert!(py.ends_with('\n') && !py.ends_with("\n\n"));
        assert!(!py.lines().any(|l| l.ends_with(' ')), "trailing spaces");
        for (_, ts) in TypeScript::default().emit(&api) {
            assert!(ts.starts_with(&format!("// {}\n", ferry_sdk_gen::PREAMBLE)), "{ts}");
            assert!(ts.ends_with('\n') && !ts.ends_with("\n\n"));
            assert!(!ts.lines().any(|l| l.ends_with(' ')), "trailing spaces");
        }
    }
}
