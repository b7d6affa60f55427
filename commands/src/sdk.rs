//! The built-in APIs (`ferry serve --api demo|conformance`) and `ferry sdk`: typed Python
//! and TypeScript clients for any ferry server, generated from its OpenRPC document by
//! [`ferry_sdk_gen`].

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, bail};
use ferry_rpc::Server;
use ferry_sdk_gen::{Emitter, Lang};
use serde_json::Value;

/// An API built into the `ferry` binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// The demo API ([`crate::demo`]).
    Demo,
    /// The conformance API every SDK is tested against ([`crate::conformance_api`]).
    Conformance,
}

impl Api {
    /// Every built-in API.
    pub const ALL: [Api; 2] = [Api::Demo, Api::Conformance];

    /// Its name (also the generated module's name).
    pub fn name(self) -> &'static str {
        match self {
            Api::Demo => "demo",
            Api::Conformance => "conformance",
        }
    }

    /// A server of it.
    pub fn server(self) -> Server {
        match self {
            Api::Demo => crate::demo::server(),
            Api::Conformance => crate::conformance_api::server(),
        }
    }

    /// Its OpenRPC document, built in-process (what `rpc.discover` answers).
    pub fn document(self) -> Value {
        self.server().discover().clone()
    }
}

impl FromStr for Api {
    type Err = String;

    fn from_str(s: &str) -> Result<Api, String> {
        match s {
            "demo" => Ok(Api::Demo),
            "conformance" => Ok(Api::Conformance),
            other => Err(format!("unknown API {other:?}: expected demo or conformance")),
        }
    }
}

/// The OpenRPC document `from` names, and a module name for it: a built-in API (`demo`,
/// `conformance`), a server address (`unix:NAME`, `unix:/path`, `quic://..`: asked with
/// `rpc.discover`), or a JSON file.
pub async fn document(from: &str, timeout: Duration) -> anyhow::Result<(Value, String)> {
    if let Ok(api) = from.parse::<Api>() {
        return Ok((api.document(), api.name().to_owned()));
    }
    let doc = if from.starts_with("unix:") || from.contains("://") {
        crate::cli_rpc::discover(from, std::env::var("FERRY_TOKEN").ok().as_deref(), timeout).await?
    } else {
        let text = std::fs::read_to_string(from).with_context(|| format!("reading {from}"))?;
        serde_json::from_str(&text).with_context(|| format!("{from} is not JSON"))?
    };
    let title = doc.pointer("/info/title").and_then(Value::as_str).unwrap_or("api");
    Ok((doc.clone(), ferry_sdk_gen::module_name(title)))
}

/// `ferry sdk`: writes the client of the API `from` names into `out`; returns the files
/// written. `name` overrides the module name; TypeScript imports the runtime from
/// `ts_runtime`.
pub async fn generate(
    lang: Lang,
    from: &str,
    out: &Path,
    name: Option<&str>,
    ts_runtime: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<PathBuf>> {
    let (doc, default_name) = document(from, timeout).await?;
    let name = name.unwrap_or(&default_name);
    let mut api =
        ferry_sdk_gen::ir::Api::from_openrpc(name, &doc).with_context(|| format!("reading the API of {from}"))?;
    api.generated_by = command_line(lang, from, name, &default_name, ts_runtime);
    for w in &api.warnings {
        eprintln!("ferry sdk: warning: {w}");
    }
    let files = match lang {
        Lang::Python => ferry_sdk_gen::python::Python.emit(&api),
        Lang::TypeScript => ferry_sdk_gen::typescript::TypeScript { runtime: ts_runtime.to_owned() }.emit(&api),
    };
    if files.is_empty() {
        bail!("nothing to generate");
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut written = Vec::new();
    for (path, text) in files {
        let path = out.join(path);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The `ferry sdk` command that makes this client again (the output directory left out:
/// the same command writes the same files wherever they go).
fn command_line(lang: Lang, from: &str, name: &str, default_name: &str, ts_runtime: &str) -> String {
    let lang = match lang {
        Lang::Python => "python",
        Lang::TypeScript => "typescript",
    };
    let mut line = format!("ferry sdk --lang {lang} --from {from}");
    if name != default_name {
        line.push_str(&format!(" --name {name}"));
    }
    if lang == "typescript" && ts_runtime != "ferry-client" {
        line.push_str(&format!(" --ts-runtime {ts_runtime}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_documents_generate() {
        for api in Api::ALL {
            let doc = api.document();
            let files = ferry_sdk_gen::generate(api.name(), &doc, Lang::Python).unwrap();
            assert_eq!(files.len(), 1);
            // TypeScript: the module (`.js`) and its declarations (`.d.ts`).
            let files = ferry_sdk_gen::generate(api.name(), &doc, Lang::TypeScript).unwrap();
            let names: Vec<_> = files.iter().map(|(p, _)| p.display().to_string()).collect();
            assert_eq!(names, [format!("{}.js", api.name()), format!("{}.d.ts", api.name())]);
        }
        assert_eq!("conformance".parse::<Api>(), Ok(Api::Conformance));
        assert_eq!(
            command_line(Lang::Python, "unix:x", "x", "x", "ferry-client"),
            "ferry sdk --lang python --from unix:x"
        );
        assert_eq!(
            command_line(Lang::TypeScript, "api.json", "calc", "api", "./rt.js"),
            "ferry sdk --lang typescript --from api.json --name calc --ts-runtime ./rt.js"
        );
        assert!("nope".parse::<Api>().is_err());
    }
}
