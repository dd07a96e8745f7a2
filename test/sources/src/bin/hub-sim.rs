//! `hub-sim`: serves a **simulated** Hugging Face Hub on loopback for the demo and for manual
//! tests (`HF_ENDPOINT=http://<address> hf download <repo>`). See `warmcache_test_sources::hub`.

use std::net::SocketAddr;

use anyhow::{Context, bail};
use clap::Parser;
use warmcache_test_sources::hub::{Hub, HubOptions, model_files};

#[derive(Parser, Debug)]
#[command(
    name = "hub-sim",
    about = "A simulated Hugging Face Hub on loopback (HTTP)"
)]
struct Args {
    /// Address to listen on; port 0 picks a free one (printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// A generated model repository: `ORG/NAME=BYTES[:SHARDS]` (weights in all; 4 shards by
    /// default). Repeatable.
    #[arg(long = "repo", value_name = "ORG/NAME=BYTES[:SHARDS]")]
    repos: Vec<String>,
    /// Bytes per second shared by all downloads (a WAN link); 0: unlimited.
    #[arg(long, default_value_t = 0)]
    rate_limit: u64,
}

fn parse_repo(spec: &str) -> anyhow::Result<(String, u64, u32)> {
    let (name, size) = spec
        .split_once('=')
        .with_context(|| format!("--repo {spec:?}: expected ORG/NAME=BYTES[:SHARDS]"))?;
    let (bytes, shards) = match size.split_once(':') {
        Some((b, s)) => (
            b,
            s.parse()
                .with_context(|| format!("--repo {spec:?}: shards"))?,
        ),
        None => (size, 4),
    };
    let bytes = bytes
        .parse()
        .with_context(|| format!("--repo {spec:?}: bytes must be a whole number"))?;
    if shards == 0 {
        bail!("--repo {spec:?}: at least one shard");
    }
    Ok((name.to_owned(), bytes, shards))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let hub = Hub::new(HubOptions {
        rate_limit: (args.rate_limit > 0).then_some(args.rate_limit),
    });
    for spec in &args.repos {
        let (name, bytes, shards) = parse_repo(spec)?;
        let commit = hub
            .publish(&name, model_files(&name, "1", bytes, shards))
            .with_context(|| format!("--repo {spec:?}"))?;
        println!("repo {name} main={commit}");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    println!("listening on http://{}", listener.local_addr()?);
    hub.serve(listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .context("serving")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_specs() {
        assert_eq!(parse_repo("o/m=100").unwrap(), ("o/m".into(), 100, 4));
        assert_eq!(parse_repo("o/m=100:2").unwrap(), ("o/m".into(), 100, 2));
        assert!(parse_repo("o/m").is_err());
        assert!(parse_repo("o/m=x").is_err());
        assert!(parse_repo("o/m=1:0").is_err());
    }
}
