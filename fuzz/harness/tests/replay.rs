//! Replays every file of `fuzz/corpus/TARGET/` and `fuzz/regressions/TARGET/` through the
//! target's harness function, so that a plain `cargo test` (and CI) runs the checked-in
//! corpus and every crash the fuzzers found. Linux only, as the harness.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect();
    v.sort();
    v
}

#[test]
fn corpus_and_regressions_replay() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut total = 0;
    for (name, run) in ferry_fuzz_harness::TARGETS {
        let corpus = files(&fuzz.join("corpus").join(name));
        assert!(!corpus.is_empty(), "no seed corpus for target {name} in fuzz/corpus/{name}");
        for path in corpus.iter().chain(&files(&fuzz.join("regressions").join(name))) {
            let data = match std::fs::read(path) {
                Ok(d) => d,
                // A fuzzer running on the corpus replaces files as it goes.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => panic!("{}: {e}", path.display()),
            };
            run(&data);
            total += 1;
        }
    }
    assert!(total > 0);
}

#[test]
fn every_target_has_a_fuzz_target_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz_targets");
    for (name, _) in ferry_fuzz_harness::TARGETS {
        let file = dir.join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(text.contains(&format!("ferry_fuzz_harness::{name}(")), "{} does not call the harness", file.display());
    }
}
