//! Writes the reference's test vectors (and our boundary and ratchet cases) as YAML seed inputs
//! of the `backend_yaml` target: `cargo run --bin seed_corpus -- corpus/backend_yaml`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "corpus/backend_yaml".to_owned()),
    );
    std::fs::create_dir_all(&dir)?;
    let mut written = 0;
    for (i, vector) in warmcache_kvcache::vectors::all().iter().enumerate() {
        let mut text = serde_saphyr::to_string(&vector.new)?;
        if let Some(old) = &vector.old {
            text.push_str("\n---old\n");
            text.push_str(&serde_saphyr::to_string(old)?);
        }
        std::fs::write(dir.join(format!("{i:03}-{}.yaml", vector.id)), text)?;
        written += 1;
    }
    println!("wrote {written} seed inputs to {}", dir.display());
    Ok(())
}
