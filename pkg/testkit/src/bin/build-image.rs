//! `build-image --bin-dir DIR --out DIR [--reference REF] [--binary NAME]...`: packs the
//! warmcache image ([`warmcache_testkit::component_image`]) from the component binaries in
//! `DIR` into an OCI archive under `--out`, and prints the archive's path. Used by
//! `hack/build-image.sh`; push the archive with `skopeo copy oci-archive:<path>
//! docker://<registry>/warmcache:<tag>` (or `crane push <path> <registry>/warmcache:<tag>`).

use std::path::PathBuf;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: build-image --bin-dir DIR --out DIR [--reference REF] [--binary NAME]...\n\
         (default reference warmcache.test/warmcache:<version>; default binaries: {})",
        warmcache_testkit::COMPONENT_BINARIES.join(", ")
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut bin_dir: Option<PathBuf> = None;
    let mut out: Option<PathBuf> = None;
    let mut reference = format!("warmcache.test/warmcache:{}", env!("CARGO_PKG_VERSION"));
    let mut binaries: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let Some(value) = args.next() else {
            return usage();
        };
        match arg.as_str() {
            "--bin-dir" => bin_dir = Some(PathBuf::from(value)),
            "--out" => out = Some(PathBuf::from(value)),
            "--reference" => reference = value,
            "--binary" => binaries.push(value),
            _ => return usage(),
        }
    }
    let (Some(bin_dir), Some(out)) = (bin_dir, out) else {
        return usage();
    };
    if binaries.is_empty() {
        binaries = warmcache_testkit::COMPONENT_BINARIES
            .iter()
            .map(|b| (*b).to_owned())
            .collect();
    }
    let names: Vec<&str> = binaries.iter().map(String::as_str).collect();
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("build-image: creating {}: {e}", out.display());
        return ExitCode::from(1);
    }
    match warmcache_testkit::component_image(&reference, &bin_dir, &names)
        .and_then(|image| image.build(&out))
    {
        Ok(archive) => {
            println!("{}", archive.path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("build-image: {e}");
            ExitCode::from(1)
        }
    }
}
