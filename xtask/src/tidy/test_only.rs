//! Test-only code stays out of the public API and out of production builds.
//!
//! A crate's helpers for tests (`ferry_shm::testing`, `ferry_ring::testing`,
//! `ferry_cuda_ipc::fake`) are public so that its integration tests and other crates' tests
//! can use them, but only under the crate's [`TEST_FEATURE`], which tests enable through a
//! dev-dependency (on the crate itself, for its own tests). Two rules keep it so:
//!
//! - [`public_test_modules`]: a `pub mod` named like test-only code in a `src/` directory
//!   is gated by `#[cfg(test)]` or by [`TEST_FEATURE`].
//! - [`test_features`]: no build of a package that ships enables a test-only feature. From
//!   the manifests (`cargo metadata --no-deps`): every test-only feature (a name starting
//!   with `__`) is [`TEST_FEATURE`]; only the packages in [`TEST_PACKAGES`] enable one in
//!   a normal or build dependency, and no other package depends on those; no feature
//!   outside the test-only ones forwards one (`ferry-shm/__testing`). From cargo's
//!   resolution (`cargo tree -e features`): building any other package with every one of
//!   its own features, or the workspace's default members (a bare `cargo build`), enables
//!   no test-only feature anywhere. Features only add, so no smaller feature set can either.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use super::scan::{ascii_fold, attributes_before, blank_comments_and_strings, ident_at, ident_positions, item_start};

/// The one name of a crate's test-only feature. The `__` prefix follows quinn
/// (`__rustls-post-quantum-test`) and the convention docs.rs keeps of leaving features that
/// start with `_` out of a crate's feature list: it is no part of the API.
pub const TEST_FEATURE: &str = "__testing";

/// Packages that are test code themselves and so may enable [`TEST_FEATURE`] in a normal
/// dependency: `(package, why)`. Nothing else may depend on them. An entry that no longer
/// enables one fails.
const TEST_PACKAGES: &[(&str, &str)] = &[(
    "ferry-fuzz-harness",
    "the logic of the fuzz targets, which feed hostile memfds (ferry-shm) and run a cuda-ipc session on the \
     in-memory driver (ferry-cuda-ipc)",
)];

// ---------------------------------------------------------------------------------------
// No public test modules

/// Whether a module name says the module is test-only code.
fn is_test_module_name(name: &str) -> bool {
    const NAMES: &[&str] =
        &["test", "tests", "testing", "test_util", "test_utils", "test_support", "fake", "fakes", "mock", "mocks"];
    NAMES.contains(&name) || ["test_", "fake_", "mock_"].iter().any(|p| name.starts_with(p))
}

/// Every public test-only module in a `src/` directory that neither `#[cfg(test)]` nor
/// [`TEST_FEATURE`] gates.
pub fn public_test_modules(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for path in super::rust_files(root)? {
        let rel = crate::relative(root, &path);
        if !format!("/{rel}").contains("/src/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {rel}"))?;
        for (line, name) in ungated_test_modules(&text) {
            problems.push(public_test_module_problem(&rel, line, &name));
        }
    }
    Ok(problems)
}

/// The problem of an ungated `pub mod name` at `rel:line`.
fn public_test_module_problem(rel: &str, line: usize, name: &str) -> String {
    format!(
        "{rel}:{line}: `pub mod {name}` puts test-only code in the public API: gate it with \
         `#[cfg(feature = \"{TEST_FEATURE}\")]` (declared in the crate's Cargo.toml as `{TEST_FEATURE} = []`, \
         enabled by the tests through a dev-dependency), or make it private under `#[cfg(test)]`"
    )
}

/// `(line, name)` of every `pub mod NAME` with a test-only name that neither
/// `#[cfg(test)]` nor a `#[cfg(.. feature = "__testing" ..)]` gates.
fn ungated_test_modules(text: &str) -> Vec<(usize, String)> {
    let raw = ascii_fold(text);
    let code = ascii_fold(&blank_comments_and_strings(text));
    let gate = format!("feature=\"{TEST_FEATURE}\"");
    let mut found = Vec::new();
    for at in ident_positions(&code, "mod") {
        let Some(name) = ident_at(&code, at + "mod".len()) else { continue };
        let start = item_start(&code, at);
        if start == at || code[start..at].trim() != "pub" || !is_test_module_name(name) {
            continue; // private, `pub(crate)` and the like, or not a test-only name
        }
        let gated = attributes_before(&code, &raw, start).iter().any(|attr| {
            let attr: String = attr.chars().filter(|c| !c.is_whitespace()).collect();
            attr == "#[cfg(test)]" || (attr.starts_with("#[cfg(") && attr.contains(&gate) && !attr.contains("not("))
        });
        if !gated {
            found.push((code[..at].matches('\n').count() + 1, name.to_owned()));
        }
    }
    found
}

// ---------------------------------------------------------------------------------------
// Test-only features stay out of production builds

/// What the rule needs of one workspace package's manifest.
#[derive(Debug, Clone, Default)]
struct Manifest {
    name: String,
    features: BTreeMap<String, Vec<String>>,
    /// Normal and build dependencies (any target): `(package, features it enables)`.
    deps: Vec<(String, Vec<String>)>,
}

/// Whether a feature name says it is test-only.
fn is_test_feature(name: &str) -> bool {
    name.starts_with("__")
}

/// Every way a build of a package that ships could contain test-only code: see the module
/// docs.
pub fn test_features(root: &Path) -> anyhow::Result<Vec<String>> {
    let metadata = cargo(root, &["metadata", "--format-version", "1", "--no-deps"])
        .map_err(|e| anyhow::anyhow!("cargo metadata failed: {e}"))?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata).context("parsing cargo metadata")?;
    let manifests = manifests(&metadata)?;
    let mut problems = manifest_problems(&manifests, TEST_PACKAGES);

    let test_packages: Vec<&str> = TEST_PACKAGES.iter().map(|&(name, _)| name).collect();
    let mut builds: Vec<Vec<String>> = vec![vec![]]; // the default members
    for m in manifests.iter().filter(|m| !test_packages.contains(&m.name.as_str())) {
        let mut args = vec!["-p".to_owned(), m.name.clone()];
        let features: Vec<&str> =
            m.features.keys().map(String::as_str).filter(|f| !is_test_feature(f) && *f != "default").collect();
        if !features.is_empty() {
            args.extend(["--features".to_owned(), features.join(",")]);
        }
        builds.push(args);
    }
    for args in builds {
        let mut tree = vec!["tree", "--locked", "-e", "normal,build,features", "--target", "all", "--prefix", "none"];
        tree.extend(args.iter().map(String::as_str));
        let shown = format!("cargo {}", tree.join(" "));
        match cargo(root, &tree) {
            Ok(out) => {
                for (package, feature) in test_features_in_tree(&out) {
                    problems.push(format!(
                        "`{shown}`: this build enables {package}'s test-only feature `{feature}`, so test-only \
                         code ships in it: enable it in [dev-dependencies] only (see `cargo tree -e features -i \
                         {package}` for who enables it)"
                    ));
                }
            }
            Err(e) => problems.push(format!("`{shown}` failed: {e}")),
        }
    }
    Ok(problems)
}

/// `cargo ARGS` in `root`: its stdout, or its stderr as the error.
fn cargo(root: &Path, args: &[&str]) -> Result<String, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo).args(args).current_dir(root).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

/// The workspace packages of `cargo metadata --no-deps` output.
fn manifests(metadata: &serde_json::Value) -> anyhow::Result<Vec<Manifest>> {
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
    };
    let packages = metadata["packages"].as_array().context("cargo metadata: no `packages`")?;
    let mut out = Vec::new();
    for p in packages {
        let name = p["name"].as_str().context("cargo metadata: a package without a name")?.to_owned();
        let features = p["features"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(feature, enables)| (feature.clone(), strings(enables)))
            .collect();
        let deps = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| Some((d["name"].as_str()?.to_owned(), strings(&d["features"]))))
            .collect();
        out.push(Manifest { name, features, deps });
    }
    Ok(out)
}

/// The manifest half of [`test_features`] on `manifests`, with `test_packages` allowed to
/// enable test-only features.
fn manifest_problems(manifests: &[Manifest], test_packages: &[(&str, &str)]) -> Vec<String> {
    const LIST: &str = "TEST_PACKAGES in xtask/src/tidy/test_only.rs";
    let is_test_package = |name: &str| test_packages.iter().any(|&(p, _)| p == name);
    let mut problems = Vec::new();
    for m in manifests {
        let name = &m.name;
        for feature in m.features.keys().filter(|f| is_test_feature(f) && f.as_str() != TEST_FEATURE) {
            problems.push(format!(
                "{name}: test-only feature `{feature}`: name it `{TEST_FEATURE}`, the one name of a crate's \
                 test-only feature"
            ));
        }
        for (feature, enables) in m.features.iter().filter(|(f, _)| !is_test_feature(f)) {
            for e in enables.iter().filter(|e| e.split_once('/').is_some_and(|(_, f)| is_test_feature(f))) {
                problems.push(format!(
                    "{name}: feature `{feature}` enables the test-only `{e}`, putting test-only code into \
                     builds that ship: enable it in [dev-dependencies] instead"
                ));
            }
        }
        if is_test_package(name) {
            continue;
        }
        for (dep, features) in &m.deps {
            for f in features.iter().filter(|f| is_test_feature(f)) {
                problems.push(format!(
                    "{name}: its dependency {dep} enables the test-only feature `{f}`, which puts test-only \
                     code into builds that ship: enable it in [dev-dependencies] (a crate's own tests: a \
                     dev-dependency on the crate itself with `features = [\"{TEST_FEATURE}\"]`)"
                ));
            }
            if is_test_package(dep) {
                problems
                    .push(format!("{name}: depends on {dep}, which is test code ({LIST}): make it a dev-dependency"));
            }
        }
    }
    for &(package, _) in test_packages {
        let enables = manifests
            .iter()
            .find(|m| m.name == package)
            .is_some_and(|m| m.deps.iter().any(|(_, features)| features.iter().any(|f| is_test_feature(f))));
        if !enables {
            problems.push(format!(
                "{package}: enables no test-only feature in its dependencies (or is gone): remove its entry from \
                 {LIST}"
            ));
        }
    }
    problems
}

/// `(package, feature)` for every test-only feature in `cargo tree -e features --prefix
/// none` output, each once.
fn test_features_in_tree(out: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for line in out.lines() {
        let Some((package, rest)) = line.split_once(" feature \"") else { continue };
        let Some((feature, _)) = rest.split_once('"') else { continue };
        let hit = (package.trim().to_owned(), feature.to_owned());
        if is_test_feature(feature) && !found.contains(&hit) {
            found.push(hit);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_public_test_modules() {
        super::super::fail_on(public_test_modules(&crate::project_root()).unwrap()).unwrap();
    }

    #[test]
    fn no_build_that_ships_enables_a_test_feature() {
        super::super::fail_on(test_features(&crate::project_root()).unwrap()).unwrap();
    }

    #[test]
    fn finds_ungated_public_test_modules() {
        let src = "/// Helpers.\n#[doc(hidden)]\npub mod testing {\n}\n\
                   #[cfg(test)]\nmod tests;\n\
                   #[cfg(test)]\npub mod test_util;\n\
                   #[cfg(any(test, feature = \"__testing\"))]\n/// Doc.\n#[doc(hidden)]\npub mod fake;\n\
                   #[cfg(feature = \"fake\")]\npub mod fakes;\n\
                   #[cfg(not(feature = \"__testing\"))]\npub mod mock;\n\
                   pub(crate) mod fake_driver;\npub mod tensor;\n// pub mod tests;\n\
                   const S: &str = \"pub mod tests;\";\npub mod mock_gpu {}\n\
                   #[cfg(all(target_os = \"linux\", feature = \"__fake\"))]\npub mod fake_gpu;\n";
        let found = ungated_test_modules(src);
        let found: Vec<(usize, &str)> = found.iter().map(|(line, name)| (*line, name.as_str())).collect();
        assert_eq!(found, [(3, "testing"), (14, "fakes"), (16, "mock"), (21, "mock_gpu"), (23, "fake_gpu")]);
        let problem = public_test_module_problem("b/src/lib.rs", 9, "testing");
        assert!(problem.starts_with("b/src/lib.rs:9: `pub mod testing`"), "{problem}");
        assert!(problem.contains("#[cfg(feature = \"__testing\")]"), "{problem}");
    }

    fn manifest(name: &str, features: &[(&str, &[&str])], deps: &[(&str, &[&str])]) -> Manifest {
        let list = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        Manifest {
            name: name.to_owned(),
            features: features.iter().map(|&(f, e)| (f.to_owned(), list(e))).collect(),
            deps: deps.iter().map(|&(d, f)| (d.to_owned(), list(f))).collect(),
        }
    }

    #[test]
    fn finds_test_features_in_manifests_that_ship() {
        let manifests = [
            manifest("ferry-shm", &[("__testing", &[])], &[]),
            manifest("ferry-cuda-ipc", &[("__fake", &[])], &[]),
            manifest("ferry", &[("shm", &["dep:ferry-shm"]), ("testing", &["ferry-shm?/__testing"])], &[]),
            manifest("ferry-cli", &[("__testing", &["ferry-shm/__testing"])], &[("ferry-shm", &["__testing"])]),
            manifest("harness", &[], &[("ferry-shm", &["__testing"])]),
            manifest("ferry-python", &[], &[("harness", &[])]),
        ];
        let problems = manifest_problems(&manifests, &[("harness", "why"), ("gone", "why")]);
        let starts: Vec<&str> = problems.iter().map(|p| p.split(':').next().unwrap()).collect();
        assert_eq!(starts, ["ferry-cuda-ipc", "ferry", "ferry-cli", "ferry-python", "gone"], "{problems:#?}");
        assert!(problems[0].contains("`__fake`: name it `__testing`"), "{}", problems[0]);
        assert!(
            problems[1].contains("feature `testing` enables the test-only `ferry-shm?/__testing`"),
            "{}",
            problems[1]
        );
        assert!(
            problems[2].contains("dependency ferry-shm enables the test-only feature `__testing`"),
            "{}",
            problems[2]
        );
        assert!(problems[3].contains("depends on harness, which is test code"), "{}", problems[3]);
        assert!(problems[4].contains("remove its entry"), "{}", problems[4]);
    }

    #[test]
    fn finds_test_features_in_cargo_tree_output() {
        let out = "ferry-cli v0.1.0 (/w/cli)\nferry-shm feature \"default\"\nferry-shm v0.1.0 (/w/backends/shm)\n\
                   ferry-shm feature \"__testing\"\nferry-shm feature \"__testing\" (*)\n\
                   ferry-rpc feature \"fuzzing\"\nferry-cuda-ipc feature \"__testing\"\n";
        let found = test_features_in_tree(out);
        let found: Vec<(&str, &str)> = found.iter().map(|(p, f)| (p.as_str(), f.as_str())).collect();
        assert_eq!(found, [("ferry-shm", "__testing"), ("ferry-cuda-ipc", "__testing")]);
    }
}
