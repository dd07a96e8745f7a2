//! Deterministic names and digests derived from a cache handle.
//!
//! A cache handle is the model identity URI (for example `hf://Qwen/Qwen3-0.6B@v1`); it is not a
//! valid Kubernetes name, so every object name is built from a hash of it. All names of one cache
//! share the same suffix, [`handle_hash`]: 48 lowercase hex characters (the first 24 bytes of
//! SHA-256 of the handle). Hex digits are DNS-1123 safe and every prefix is lowercase
//! alphanumerics and dashes, so every name built here is a valid DNS-1123 label (the longest,
//! the binding name, has 60 characters): it is a valid object name of any kind, a valid Job name
//! (at most 63 characters, as Job names become label values) and a valid label value.

use sha2::{Digest, Sha256};

/// Number of SHA-256 bytes kept in [`handle_hash`].
const HANDLE_HASH_BYTES: usize = 24;

/// Prefix of every binding name.
pub const BINDING_NAME_PREFIX: &str = "model-cache-";

/// Prefix of the writer's read-write claim.
pub const WRITER_PVC_PREFIX: &str = "rw-pvc-";

/// Prefix of the writer (download) Job.
pub const WRITER_JOB_PREFIX: &str = "writer-job-";

/// Prefix of the read-only claim a reader namespace mounts.
pub const READER_PVC_PREFIX: &str = "ro-pvc-";

/// Prefix of the Lease that serializes writers of one cache (Helm workflow).
pub const INIT_LEASE_PREFIX: &str = "init-lease-";

/// The DNS-safe short hash of a cache handle: lowercase hex of the first 24 bytes of
/// SHA-256(`cache_handle`), always 48 characters.
pub fn handle_hash(cache_handle: &str) -> String {
    let digest = Sha256::digest(cache_handle.as_bytes());
    hex::encode(&digest[..HANDLE_HASH_BYTES])
}

/// Name of the ModelCacheBinding for a cache handle: `model-cache-<handle_hash>` (60
/// characters). The name depends on the handle only, so a second workflow or sharing domain with
/// the same handle collides with the existing binding and must not adopt it.
pub fn binding_name(cache_handle: &str) -> String {
    format!("{BINDING_NAME_PREFIX}{}", handle_hash(cache_handle))
}

/// Name of the writer's read-write PersistentVolumeClaim: `rw-pvc-<handle_hash>` (55
/// characters).
pub fn writer_pvc_name(cache_handle: &str) -> String {
    format!("{WRITER_PVC_PREFIX}{}", handle_hash(cache_handle))
}

/// Name of the writer (download) Job: `writer-job-<handle_hash>` (59 characters, within the
/// 63-character limit Job names have because they become label values).
pub fn writer_job_name(cache_handle: &str) -> String {
    format!("{WRITER_JOB_PREFIX}{}", handle_hash(cache_handle))
}

/// Name of the read-only PersistentVolumeClaim in a reader namespace: `ro-pvc-<handle_hash>`
/// (55 characters). One per namespace, so the name needs no namespace part.
pub fn reader_pvc_name(cache_handle: &str) -> String {
    format!("{READER_PVC_PREFIX}{}", handle_hash(cache_handle))
}

/// Name of the Lease that allows at most one active writer per cache:
/// `init-lease-<handle_hash>` (59 characters).
pub fn init_lease_name(cache_handle: &str) -> String {
    format!("{INIT_LEASE_PREFIX}{}", handle_hash(cache_handle))
}

/// Digest of a raw value in the form the binding records: `sha256:` followed by the lowercase
/// hex SHA-256 of the exact bytes of `raw` (no normalization). Matches `^sha256:[a-f0-9]{64}$`.
pub fn sha256_digest(raw: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(raw.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_hex(s: &str) -> bool {
        s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    fn is_dns1123_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn sha256_digest_of_empty_and_known_values() {
        assert_eq!(
            sha256_digest(""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_digest("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn handle_hash_is_first_24_bytes_of_sha256() {
        let handle = "abc";
        let full = sha256_digest(handle);
        let hash = handle_hash(handle);
        assert_eq!(hash.len(), 48);
        assert!(is_hex(&hash));
        assert_eq!(hash, full["sha256:".len().."sha256:".len() + 48]);
        assert_eq!(hash, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9c");
    }

    #[test]
    fn binding_name_has_expected_shape() {
        let name = binding_name("hf://Qwen/Qwen3-0.6B@v1");
        assert!(name.starts_with("model-cache-"));
        assert_eq!(name.len(), "model-cache-".len() + 48);
        assert!(is_hex(&name["model-cache-".len()..]));
        assert!(is_dns1123_label(&name));
        assert_eq!(
            binding_name("abc"),
            "model-cache-ba7816bf8f01cfea414140de5dae2223b00361a396177a9c"
        );
    }

    #[test]
    fn names_are_deterministic_and_handle_scoped() {
        let a = "ngc://org/team/model:1";
        let b = "ngc://org/team/model:2";
        assert_eq!(binding_name(a), binding_name(a));
        assert_ne!(binding_name(a), binding_name(b));
        assert_ne!(writer_pvc_name(a), writer_pvc_name(b));
        let suffix = handle_hash(a);
        for name in [
            binding_name(a),
            writer_pvc_name(a),
            writer_job_name(a),
            reader_pvc_name(a),
            init_lease_name(a),
        ] {
            assert!(name.ends_with(&suffix), "{name}");
        }
    }

    #[test]
    fn resource_names_are_valid_dns1123() {
        let handles = [
            "",
            "hf://Qwen/Qwen3-0.6B@v1",
            "nim://nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.3@tensorrt_llm-h100-fp8",
            "s3://My_Bucket/UPPER CASE/ünïcode",
            &"x".repeat(10_000),
        ];
        for handle in handles {
            assert_eq!(
                writer_pvc_name(handle),
                format!("rw-pvc-{}", handle_hash(handle))
            );
            assert_eq!(
                writer_job_name(handle),
                format!("writer-job-{}", handle_hash(handle))
            );
            assert_eq!(
                reader_pvc_name(handle),
                format!("ro-pvc-{}", handle_hash(handle))
            );
            assert_eq!(
                init_lease_name(handle),
                format!("init-lease-{}", handle_hash(handle))
            );
            for label in [
                binding_name(handle),
                writer_pvc_name(handle),
                writer_job_name(handle),
                reader_pvc_name(handle),
                init_lease_name(handle),
            ] {
                assert!(is_dns1123_label(&label), "{label}");
            }
        }
        assert_eq!(binding_name("abc").len(), 60);
        assert_eq!(writer_job_name("abc").len(), 59);
        assert_eq!(init_lease_name("abc").len(), 59);
    }
}
