//! Fuzz the resolver with pod JSON (what the webhook receives): decoding may fail, but whatever
//! decodes must resolve without panicking, deterministically, to an identity that round-trips
//! through its URI. The same bytes are also fed to the URI parser and the shell reader.

#![no_main]

use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use warmcache_modelid::{Identity, Outcome, debug_shell_commands, resolve, resolve_with_group};

fuzz_target!(|data: &[u8]| {
    if let Ok(pod) = serde_json::from_slice::<Pod>(data) {
        let a = resolve(&pod);
        assert_eq!(a, resolve(&pod), "resolution is deterministic");
        if let Outcome::Resolved(r) = &a {
            assert_eq!(Identity::parse(&r.identity.uri()).as_ref(), Ok(&r.identity));
            assert!(r.landing.path.starts_with('/'));
        }
        let _ = a.report_json();
        let _ = resolve_with_group(&pod, None);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(id) = Identity::parse(text) {
            assert_eq!(Identity::parse(&id.uri()).as_ref(), Ok(&id));
        }
        let _ = debug_shell_commands(text, &[("MODEL", "org/m"), ("HF_HOME", "/h")]);
    }
});
