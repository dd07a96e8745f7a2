//! `binding-controller catalog validate|explain`, end to end through the built binary: output
//! and exit codes exactly as documented.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn binding_controller(args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_binding-controller"))
        .args(args)
        .output()
        .unwrap();
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn repo(path: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
        .to_string_lossy()
        .into_owned()
}

const CATALOG: &str = "config/catalog/nvcf-storage-capabilities-v1alpha1.yaml";
const MANIFEST: &str = "config/catalog/nvcf-storage-capabilities.configmap.yaml";

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn validate_prints_ok_for_the_shipped_catalog_and_its_config_map() {
    for file in [CATALOG, MANIFEST] {
        let run = binding_controller(&["catalog", "validate", "-f", &repo(file)]);
        assert_eq!(
            (run.code, run.stdout.as_str(), run.stderr.as_str()),
            (0, "ok\n", ""),
            "{file}"
        );
    }
}

#[test]
fn validate_prints_one_line_per_error_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "catalog.yaml",
        b"apiVersion: storage.nvcf.nvidia.com/v1alpha1
kind: StorageCapabilityCatalog
drivers:
  - name: csi.weka.io
    provider: weka
    accessModes: [ReadWriteOnce, ReadOnlyMany]
    readerMountOptions: [nouuid, \" ro\"]
    transitions:
      regularModelCache: roxReadOnly
  - name: csi.weka.io
    provider: weka
    accessModes: [ReadOnlyMany]
    readerMountOptions: [ro, rw]
",
    );
    let run = binding_controller(&["catalog", "validate", "-f", &file]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stderr, "");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "drivers[0].transitions: unknown field \"transitions\": the flow is derived from accessModes and never declared; remove it",
            "drivers[0].readerMountOptions[1]: value \" ro\" has surrounding whitespace: remove it",
            "drivers[0].readerMountOptions: driver \"csi.weka.io\" qualifies ReadWriteOnce with ReadOnlyMany, so its readers get derived read-only volumes: it must list readerMountOption \"ro\"",
            "drivers[1].readerMountOptions[1]: readerMountOption \"rw\" would make reader volumes writable: readers of a shared cache are read-only; remove it",
            "drivers[1].accessModes: driver \"csi.weka.io\" lists ReadOnlyMany with no writer mode: nothing could populate the cache; add the qualified writer mode (ReadWriteOnce or ReadWriteMany) or remove ReadOnlyMany",
            "drivers[1].name: catalog lists driver \"csi.weka.io\" twice (first at drivers[0]): keep one entry per provisioner",
        ]
    );
}

#[test]
fn validate_reports_config_map_paths() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = std::fs::read_to_string(repo(MANIFEST)).unwrap();
    let broken = manifest
        .replace(
            "name: nvcf-storage-capabilities",
            "name: storage-capabilities",
        )
        .replace("    provider: ociLustre\n", "    provider: \"\"\n");
    let file = write(dir.path(), "cm.yaml", broken.as_bytes());
    let run = binding_controller(&["catalog", "validate", "-f", &file]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stdout.lines().collect::<Vec<_>>(),
        [
            "metadata.name: the catalog ConfigMap must be named \"nvcf-storage-capabilities\", found \"storage-capabilities\": the controllers read only that name",
            "data[storage-provider-capabilities.yaml].drivers[4].provider: blank provider: an empty provisioner or provider cannot name a driver",
        ]
    );

    let no_data = write(
        dir.path(),
        "empty-cm.yaml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: nvcf-storage-capabilities\ndata:\n  other: x\n",
    );
    let run = binding_controller(&["catalog", "validate", "-f", &no_data]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stdout,
        "data[storage-provider-capabilities.yaml]: the ConfigMap has no \"storage-provider-capabilities.yaml\" data: put the catalog document there\n"
    );

    let not_yaml_inside = write(
        dir.path(),
        "bad-cm.yaml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: nvcf-storage-capabilities\ndata:\n  storage-provider-capabilities.yaml: \"drivers: [\"\n",
    );
    let run = binding_controller(&["catalog", "validate", "-f", &not_yaml_inside]);
    assert_eq!(run.code, 1, "the manifest is YAML; its field is wrong");
    assert!(
        run.stdout.starts_with(
            "data[storage-provider-capabilities.yaml]: parse storage capability catalog: not YAML: "
        ),
        "{}",
        run.stdout
    );
    assert_eq!(run.stdout.lines().count(), 1);
}

#[test]
fn unusable_input_exits_2_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir
        .path()
        .join("missing.yaml")
        .to_string_lossy()
        .into_owned();
    let not_yaml = write(dir.path(), "bad.yaml", b"drivers: [\n");
    let not_text = write(dir.path(), "bin.yaml", &[0xff, 0xfe, 0x00]);
    let cases = [
        (missing.as_str(), "cannot read"),
        (not_yaml.as_str(), "not YAML"),
        (not_text.as_str(), "not UTF-8 text"),
    ];
    for (file, message) in cases {
        for args in [
            vec!["catalog", "validate", "-f", file],
            vec![
                "catalog",
                "explain",
                "-f",
                file,
                "--provisioner",
                "csi.weka.io",
                "--workflow",
                "regularModelCache",
            ],
        ] {
            let run = binding_controller(&args);
            assert_eq!(run.code, 2, "{args:?}");
            assert_eq!(run.stdout, "", "{args:?}");
            assert!(run.stderr.contains(message), "{args:?}: {}", run.stderr);
            assert!(run.stderr.contains(file), "{}", run.stderr);
            assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        }
    }
}

const KEYS: [&str; 8] = [
    "provisioner",
    "provider",
    "workflow",
    "transition",
    "requiredAccessModes",
    "requiredMountOptions",
    "profileDigest",
    "catalogRevision",
];

fn explain(file: &str, provisioner: &str, workflow: &str) -> (Value, String) {
    let run = binding_controller(&[
        "catalog",
        "explain",
        "-f",
        file,
        "--provisioner",
        provisioner,
        "--workflow",
        workflow,
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stderr, "");
    assert_eq!(run.stdout.lines().count(), 1, "one JSON object on one line");
    (serde_json::from_str(&run.stdout).unwrap(), run.stdout)
}

fn is_sha256(v: &Value) -> bool {
    v.as_str()
        .and_then(|s| s.strip_prefix("sha256:"))
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

#[test]
fn explain_prints_the_flow_of_every_shipped_driver() {
    let catalog = repo(CATALOG);
    let rows = [
        (
            "nvmesh-csi.excelero.com",
            "regularModelCache",
            "nvmesh",
            "roxReadOnly",
            vec!["ReadWriteOnce", "ReadOnlyMany"],
            vec!["ro", "norecovery", "nouuid"],
        ),
        (
            "nvmesh-csi.excelero.com",
            "helmModelCache",
            "nvmesh",
            "roxReadOnly",
            vec!["ReadWriteOnce", "ReadOnlyMany"],
            vec!["ro", "norecovery", "nouuid"],
        ),
        (
            "csi.weka.io",
            "regularModelCache",
            "weka",
            "rwxReadOnly",
            vec!["ReadWriteMany"],
            vec![],
        ),
        (
            "csi.weka.io",
            "helmModelCache",
            "weka",
            "rwxReadOnly",
            vec!["ReadWriteMany"],
            vec![],
        ),
        (
            "fss.csi.oraclecloud.com",
            "helmModelCache",
            "ociFss",
            "rwxReadOnly",
            vec!["ReadWriteMany"],
            vec![],
        ),
        (
            "csi.trident.netapp.io",
            "regularModelCache",
            "netappTrident",
            "rwxReadOnly",
            vec!["ReadWriteMany"],
            vec![],
        ),
        (
            "lustre.csi.oraclecloud.com",
            "regularModelCache",
            "ociLustre",
            "disabled",
            vec![],
            vec![],
        ),
    ];
    for (provisioner, workflow, provider, transition, modes, options) in rows {
        let (json, text) = explain(&catalog, provisioner, workflow);
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected: Vec<&str> = KEYS.to_vec();
        if transition == "disabled" {
            expected.push("reason");
        }
        // Key order as printed.
        let positions: Vec<usize> = expected
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert_eq!(keys.len(), expected.len(), "{text}");
        assert_eq!(json["provisioner"], provisioner);
        assert_eq!(json["provider"], provider);
        assert_eq!(json["workflow"], workflow);
        assert_eq!(json["transition"], transition);
        assert_eq!(json["requiredAccessModes"], serde_json::json!(modes));
        assert_eq!(json["requiredMountOptions"], serde_json::json!(options));
        assert!(is_sha256(&json["profileDigest"]), "{text}");
        assert!(is_sha256(&json["catalogRevision"]), "{text}");
    }
}

#[test]
fn explain_an_unknown_provisioner_is_disabled_with_a_reason() {
    let (json, _) = explain(&repo(CATALOG), "ebs.csi.aws.com", "helmModelCache");
    assert_eq!(json["transition"], "disabled");
    assert_eq!(json["provider"], Value::Null);
    assert_eq!(json["profileDigest"], Value::Null);
    assert_eq!(json["requiredAccessModes"], serde_json::json!([]));
    assert!(
        json["reason"]
            .as_str()
            .unwrap()
            .contains("no entry for provisioner \"ebs.csi.aws.com\"")
    );
}

#[test]
fn explain_revision_is_the_payload_digest_whatever_the_file_form() {
    let (bare, _) = explain(&repo(CATALOG), "csi.weka.io", "regularModelCache");
    let (manifest, _) = explain(&repo(MANIFEST), "csi.weka.io", "regularModelCache");
    assert_eq!(bare, manifest);
    assert_eq!(
        bare["catalogRevision"],
        warmcache_catalog_revision(&std::fs::read_to_string(repo(CATALOG)).unwrap())
    );
    // The profile digest survives an unrelated edit; the revision does not.
    let dir = tempfile::tempdir().unwrap();
    let edited = format!(
        "# a comment\n{}",
        std::fs::read_to_string(repo(CATALOG)).unwrap()
    )
    .replace(
        "provider: ociLustre\n    accessModes: []",
        "provider: ociLustre\n    accessModes: [ReadWriteMany]",
    );
    let file = write(dir.path(), "edited.yaml", edited.as_bytes());
    let (after, _) = explain(&file, "csi.weka.io", "regularModelCache");
    assert_eq!(after["profileDigest"], bare["profileDigest"]);
    assert_ne!(after["catalogRevision"], bare["catalogRevision"]);
}

fn warmcache_catalog_revision(payload: &str) -> Value {
    Value::String(warmcache_catalog::catalog_revision(payload))
}

#[test]
fn explain_an_invalid_catalog_prints_its_errors_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.yaml",
        b"apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\ndrivers: []\n",
    );
    let run = binding_controller(&[
        "catalog",
        "explain",
        "-f",
        &file,
        "--provisioner",
        "csi.weka.io",
        "--workflow",
        "helmModelCache",
    ]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stdout,
        "drivers: storage capability catalog has no drivers: list at least one driver\n"
    );
}

#[test]
fn command_line_errors_exit_2() {
    for args in [
        vec![],
        vec!["run"],
        vec!["catalog"],
        vec!["catalog", "validate"],
        vec!["catalog", "explain", "-f", "f.yaml", "--provisioner", "p"],
        vec![
            "catalog",
            "explain",
            "-f",
            "f.yaml",
            "--provisioner",
            "p",
            "--workflow",
            "RegularModelCache",
        ],
    ] {
        let run = binding_controller(&args);
        assert_eq!(run.code, 2, "{args:?}");
        assert_eq!(run.stdout, "", "{args:?}");
    }
}

#[test]
fn validate_reads_standard_input() {
    let catalog = std::fs::read(repo(CATALOG)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_binding-controller"))
        .args(["catalog", "validate", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&catalog).unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
}

#[test]
fn an_endless_input_is_refused_with_exit_2() {
    let run = binding_controller(&["catalog", "validate", "-f", "/dev/zero"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr.contains("larger than 4194304 bytes"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_positional_file_is_a_usage_error() {
    // One convention for every command: the input is `-f FILE`.
    let run = binding_controller(&["catalog", "validate", &repo(CATALOG)]);
    assert_eq!(run.code, 2);
    assert_eq!(run.stdout, "");
}
