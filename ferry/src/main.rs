//! The `ferry` command-line tool.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferry::DType;
use ferry::bench::{self, BenchOptions};

/// ferry moves tensors between processes as fast as the hardware allows.
#[derive(Parser)]
#[command(name = "ferry", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Round-trip a tensor through a second process over every compiled-in backend
    /// (p50/p99 and GB/s, beside a 64-byte round trip and a memcpy of the same bytes).
    Bench {
        /// Shape of the tensor, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1920,1080,3")]
        shape: Vec<u64>,
        /// Element type: bool, u8, i8, u16, i16, u32, i32, u64, i64, f16, bf16, f32, f64.
        #[arg(long, default_value = "f32")]
        dtype: DType,
        /// Timed round trips of the tensor.
        #[arg(long, default_value_t = 50)]
        iters: usize,
        /// Timed round trips of the 64-byte message.
        #[arg(long, default_value_t = 2000)]
        small_iters: usize,
        /// Untimed round trips before each measurement.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Also measure a u8 tensor of this many MiB (0: skip).
        #[arg(long, default_value_t = 256)]
        big_mib: u64,
        /// Timed round trips of the big tensor.
        #[arg(long, default_value_t = 10)]
        big_iters: usize,
        /// Only this backend or channel (repeatable), e.g. `--only pipe`.
        #[arg(long)]
        only: Vec<String>,
        /// Print one JSON object per row and line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show the compiled-in transports and channels and the protocol version.
    Info,
    /// Internal: the benchmark's echo peer.
    #[command(name = "__echo", hide = true)]
    Echo {
        /// Address to listen on.
        addr: String,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("FERRY_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferry: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(async move {
        match cli.command {
            Cmd::Bench { shape, dtype, iters, small_iters, warmup, big_mib, big_iters, only, json } => {
                let opts = BenchOptions {
                    shape,
                    dtype,
                    iters: iters.max(1),
                    small_iters: small_iters.max(1),
                    warmup,
                    big_mib,
                    big_iters: big_iters.max(1),
                    only,
                    progress: !json,
                };
                let exe = std::env::current_exe()?;
                if !json {
                    eprintln!(
                        "ferry bench: {} round trips of {}[{}] and {} of 64 bytes per backend",
                        opts.iters,
                        opts.dtype,
                        opts.shape.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
                        opts.small_iters
                    );
                }
                let rows = bench::run(&exe, &opts, |r| {
                    if json {
                        println!("{}", serde_json::to_string(r).unwrap_or_default());
                    }
                })
                .await?;
                if !json {
                    print!("{}", bench::table(&rows));
                    println!("round trips: GB/s counts both directions; memcpy: one copy.");
                }
                Ok(())
            }
            Cmd::Info => {
                let ep = ferry::endpoint().build();
                println!("ferry {} (protocol version {})", env!("CARGO_PKG_VERSION"), ferry::PROTOCOL_VERSION);
                println!(
                    "transports: {}",
                    ferry::transports()
                        .iter()
                        .map(|t| format!("{} ({}:)", t.name(), t.scheme()))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                println!("channels (priority order): {}", ep.channel_names().join(", "));
                Ok(())
            }
            Cmd::Echo { addr } => bench::echo_peer(&addr).await,
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry: {e:#}");
            ExitCode::FAILURE
        }
    }
}
