//! Deterministic file contents. A generated file's bytes are computed on demand from a seed, one
//! 64 KiB block at a time, so any byte range of a simulated multi-GiB model costs neither memory
//! nor disk, and two runs (or a test and the server) agree on every byte.

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// Size of one generated block: the unit a read is computed in.
pub const BLOCK: u64 = 64 * 1024;

/// What a file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// `size` pseudo-random bytes derived from `seed` (weights: incompressible, like real shards).
    Generated { seed: u64, size: u64 },
    /// These bytes (configs, indexes: real JSON a loader parses).
    Literal(Bytes),
}

impl Content {
    /// Pseudo-random bytes whose seed is derived from `parts` (for example repository, commit and
    /// path), so a new commit of the same path has other bytes.
    pub fn generated(parts: &[&str], size: u64) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part.as_bytes());
            hasher.update([0u8]);
        }
        let digest = hasher.finalize();
        let mut seed = [0u8; 8];
        seed.copy_from_slice(&digest[..8]);
        Content::Generated {
            seed: u64::from_le_bytes(seed),
            size,
        }
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Content::Generated { size, .. } => *size,
            Content::Literal(bytes) => bytes.len() as u64,
        }
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes from `offset` up to at most `max` bytes, never past the end of the file nor
    /// past the end of the block `offset` lies in. Empty at or past the end.
    pub fn chunk(&self, offset: u64, max: usize) -> Bytes {
        let len = self.len();
        if offset >= len || max == 0 {
            return Bytes::new();
        }
        match self {
            Content::Literal(bytes) => {
                // offset < len, which came from a usize.
                let start = offset as usize;
                let end = start.saturating_add(max).min(bytes.len());
                bytes.slice(start..end)
            }
            Content::Generated { seed, .. } => {
                let index = offset / BLOCK;
                let block_start = index * BLOCK;
                let block_len = (len - block_start).min(BLOCK) as usize;
                let block = generate_block(*seed, index, block_len);
                let from = (offset - block_start) as usize;
                let to = from.saturating_add(max).min(block_len);
                Bytes::from(block).slice(from..to)
            }
        }
    }

    /// Every byte, for tests and small files.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(usize::try_from(self.len()).unwrap_or(0));
        let mut offset = 0;
        loop {
            let chunk = self.chunk(offset, BLOCK as usize);
            if chunk.is_empty() {
                return out;
            }
            offset += chunk.len() as u64;
            out.extend_from_slice(&chunk);
        }
    }

    /// The SHA-256 of the whole file, lowercase hex (what `sha256sum` prints).
    pub fn sha256(&self) -> String {
        let mut hasher = Sha256::new();
        let mut offset = 0;
        loop {
            let chunk = self.chunk(offset, BLOCK as usize);
            if chunk.is_empty() {
                return hex::encode(hasher.finalize());
            }
            offset += chunk.len() as u64;
            hasher.update(&chunk);
        }
    }
}

/// One block of a generated file: splitmix64 seeded by the file's seed and the block index.
fn generate_block(seed: u64, index: u64, len: usize) -> Vec<u8> {
    let mut state = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut out = Vec::with_capacity(len.next_multiple_of(8));
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_range_matches_the_whole_file() {
        let c = Content::generated(&["org/model", "abc", "model.safetensors"], 3 * BLOCK + 123);
        let whole = c.to_vec();
        assert_eq!(whole.len() as u64, c.len());
        for offset in [0, 1, BLOCK - 1, BLOCK, 2 * BLOCK + 77, c.len() - 1] {
            let chunk = c.chunk(offset, 1000);
            let start = offset as usize;
            assert_eq!(
                &chunk[..],
                &whole[start..start + chunk.len()],
                "offset {offset}"
            );
            assert!(!chunk.is_empty());
        }
        assert!(c.chunk(c.len(), 10).is_empty());
        // A chunk never crosses a block boundary.
        assert_eq!(c.chunk(BLOCK - 10, 100).len(), 10);
    }

    #[test]
    fn seeds_differ_by_path_and_commit_and_hash_like_sha256sum() {
        let a = Content::generated(&["r", "c1", "f"], 1000);
        let b = Content::generated(&["r", "c2", "f"], 1000);
        let again = Content::generated(&["r", "c1", "f"], 1000);
        assert_ne!(a.to_vec(), b.to_vec());
        assert_eq!(a, again);
        let literal = Content::Literal(Bytes::from_static(b"hello\n"));
        assert_eq!(
            literal.sha256(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(literal.chunk(2, 100), Bytes::from_static(b"llo\n"));
    }
}
