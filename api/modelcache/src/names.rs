//! Deterministic names and digests of one cache.
//!
//! One binding exists per (workflow, sharing domain, cache handle) — the three values its
//! `spec.identity` records — so every object name is derived from that whole identity, never
//! from the cache handle alone: two sharing domains caching the same model get two bindings,
//! two primary claims and two Leases, and neither can adopt the other's. A cache handle (the
//! model identity URI, e.g. `hf://Qwen/Qwen3-0.6B@v1`) and a sharing domain are not valid
//! Kubernetes names, so names carry a hash instead: [`identity_hash`], 48 lowercase hex
//! characters (the first 24 bytes of SHA-256 of the identity's workflow and two digests). Hex
//! digits are DNS-1123 safe and every prefix is lowercase alphanumerics and dashes, so every name
//! built here is a valid DNS-1123 label (the longest, the binding name, has 60 characters): a
//! valid object name of any kind, a valid Job name (at most 63 characters, as Job names become
//! label values) and a valid label value.

use sha2::{Digest, Sha256};

use crate::v2beta1::BindingIdentity;

/// Number of SHA-256 bytes kept in [`identity_hash`].
const IDENTITY_HASH_BYTES: usize = 24;

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

/// The DNS-safe hash naming every object of one cache: lowercase hex of the first 24 bytes of
/// SHA-256 over `<workflow>\n<sharingDomainDigest>\n<cacheHandleDigest>` of `identity`, always
/// 48 characters. The contract version is left out, so a later version of the selection
/// contract does not rename existing caches.
pub fn identity_hash(identity: &BindingIdentity) -> String {
    let key = format!(
        "{}\n{}\n{}",
        identity.workflow.as_str(),
        identity.sharing_domain_digest,
        identity.cache_handle_digest
    );
    let digest = Sha256::digest(key.as_bytes());
    hex::encode(&digest[..IDENTITY_HASH_BYTES])
}

/// Whether `hash` has the shape of an [`identity_hash`]: 48 lowercase hex characters (a label
/// value that could name a cache).
pub fn is_identity_hash(hash: &str) -> bool {
    hash.len() == 2 * IDENTITY_HASH_BYTES
        && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Name of the ModelCacheBinding of `identity`: `model-cache-<identity_hash>` (60 characters).
pub fn binding_name(identity: &BindingIdentity) -> String {
    binding_name_of_hash(&identity_hash(identity))
}

/// [`binding_name`] from an identity hash already computed ([`identity_hash`]).
pub fn binding_name_of_hash(hash: &str) -> String {
    format!("{BINDING_NAME_PREFIX}{hash}")
}

/// Name of the writer's read-write PersistentVolumeClaim: `rw-pvc-<identity_hash>` (55
/// characters).
pub fn writer_pvc_name(identity: &BindingIdentity) -> String {
    format!("{WRITER_PVC_PREFIX}{}", identity_hash(identity))
}

/// Name of the writer (download) Job: `writer-job-<identity_hash>` (59 characters, within the
/// 63-character limit Job names have because they become label values).
pub fn writer_job_name(identity: &BindingIdentity) -> String {
    format!("{WRITER_JOB_PREFIX}{}", identity_hash(identity))
}

/// Name of the read-only PersistentVolumeClaim in a reader namespace: `ro-pvc-<identity_hash>`
/// (55 characters). One per namespace and cache.
pub fn reader_pvc_name(identity: &BindingIdentity) -> String {
    format!("{READER_PVC_PREFIX}{}", identity_hash(identity))
}

/// Name of the Lease that allows at most one active writer per cache:
/// `init-lease-<identity_hash>` (59 characters).
pub fn init_lease_name(identity: &BindingIdentity) -> String {
    format!("{INIT_LEASE_PREFIX}{}", identity_hash(identity))
}

/// Digest of a raw value in the form the binding records: `sha256:` followed by the lowercase
/// hex SHA-256 of the exact bytes of `raw` (no normalization). Matches `^sha256:[a-f0-9]{64}$`.
pub fn sha256_digest(raw: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(raw.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v2beta1::Workflow;

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

    fn id(workflow: Workflow, domain: &str, handle: &str) -> BindingIdentity {
        BindingIdentity::new(workflow, domain, handle)
    }

    #[test]
    fn only_an_identity_hash_shape_is_one() {
        let hash = identity_hash(&BindingIdentity::new(
            crate::v2beta1::Workflow::HelmModelCache,
            "domain",
            "hf://org/m?layout=hub",
        ));
        assert!(is_identity_hash(&hash));
        assert!(!is_identity_hash(&hash.to_uppercase()));
        assert!(!is_identity_hash(&hash[..47]));
        assert!(!is_identity_hash(&format!("{hash}0")));
        assert!(!is_identity_hash(&format!("{}g", &hash[..47])));
    }

    #[test]
    fn identity_hash_is_first_24_bytes_of_sha256_of_the_identity() {
        let identity = id(
            Workflow::RegularModelCache,
            "team-a",
            "hf://Qwen/Qwen3-0.6B@v1",
        );
        let key = format!(
            "regularModelCache\n{}\n{}",
            sha256_digest("team-a"),
            sha256_digest("hf://Qwen/Qwen3-0.6B@v1")
        );
        let full = sha256_digest(&key);
        let hash = identity_hash(&identity);
        assert_eq!(hash.len(), 48);
        assert!(is_hex(&hash));
        assert_eq!(hash, full["sha256:".len().."sha256:".len() + 48]);
    }

    #[test]
    fn binding_name_has_expected_shape() {
        let name = binding_name(&id(
            Workflow::HelmModelCache,
            "nca-1",
            "hf://Qwen/Qwen3-0.6B@v1",
        ));
        assert!(name.starts_with("model-cache-"));
        assert_eq!(name.len(), 60);
        assert!(is_hex(&name["model-cache-".len()..]));
        assert!(is_dns1123_label(&name));
    }

    #[test]
    fn every_part_of_the_identity_scopes_the_names() {
        let base = id(
            Workflow::RegularModelCache,
            "team-a",
            "ngc://org/team/model:1",
        );
        let others = [
            id(
                Workflow::RegularModelCache,
                "team-a",
                "ngc://org/team/model:2",
            ),
            id(
                Workflow::RegularModelCache,
                "team-b",
                "ngc://org/team/model:1",
            ),
            id(Workflow::HelmModelCache, "team-a", "ngc://org/team/model:1"),
        ];
        assert_eq!(binding_name(&base), binding_name(&base.clone()));
        for other in &others {
            assert_ne!(binding_name(&base), binding_name(other), "{other:?}");
            assert_ne!(writer_pvc_name(&base), writer_pvc_name(other), "{other:?}");
            assert_ne!(init_lease_name(&base), init_lease_name(other), "{other:?}");
            assert_ne!(reader_pvc_name(&base), reader_pvc_name(other), "{other:?}");
            assert_ne!(writer_job_name(&base), writer_job_name(other), "{other:?}");
        }
        let suffix = identity_hash(&base);
        for name in [
            binding_name(&base),
            writer_pvc_name(&base),
            writer_job_name(&base),
            reader_pvc_name(&base),
            init_lease_name(&base),
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
            let identity = id(Workflow::HelmModelCache, "Shared Domain/ü", handle);
            let hash = identity_hash(&identity);
            assert_eq!(writer_pvc_name(&identity), format!("rw-pvc-{hash}"));
            assert_eq!(writer_job_name(&identity), format!("writer-job-{hash}"));
            assert_eq!(reader_pvc_name(&identity), format!("ro-pvc-{hash}"));
            assert_eq!(init_lease_name(&identity), format!("init-lease-{hash}"));
            for label in [
                binding_name(&identity),
                writer_pvc_name(&identity),
                writer_job_name(&identity),
                reader_pvc_name(&identity),
                init_lease_name(&identity),
            ] {
                assert!(is_dns1123_label(&label), "{label}");
            }
            assert_eq!(binding_name(&identity).len(), 60);
            assert_eq!(writer_job_name(&identity).len(), 59);
            assert_eq!(init_lease_name(&identity).len(), 59);
        }
    }
}
