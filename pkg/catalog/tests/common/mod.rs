//! Shared by the catalog test crates: the packaged schema as a validator, and the catalog
//! vectors (reference section (a)) with their expected verdicts.
#![allow(dead_code)] // each including test crate uses a different part of this module

use serde_json::Value;
use warmcache_catalog::{Refusal, SCHEMA};

/// The packaged schema, compiled.
pub fn schema() -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(SCHEMA).expect("the packaged schema is JSON");
    jsonschema::validator_for(&schema).expect("the packaged schema compiles")
}

/// What the loader must say about a vector.
pub enum Expect {
    /// Accepted (and the schema accepts it too).
    Accept,
    /// Refused with (at least) this refusal at this path; the schema refuses it too.
    Refuse(&'static str, fn(&Refusal) -> bool),
    /// Refused by the loader only: duplicate driver names, which a JSON Schema cannot express.
    RefuseLoaderOnly(&'static str, fn(&Refusal) -> bool),
}

pub struct Vector {
    pub name: &'static str,
    pub yaml: String,
    pub expect: Expect,
}

/// A document with the given `drivers:` block (already indented by two spaces per item).
pub fn doc(drivers: &str) -> String {
    format!(
        "apiVersion: storage.nvcf.nvidia.com/v1alpha1\nkind: StorageCapabilityCatalog\ndrivers:\n{drivers}"
    )
}

/// One driver item with the given extra/overriding lines.
pub fn driver(name: &str, modes: &str, options: &str, extra: &str) -> String {
    let mut s = format!(
        "  - name: {name}\n    provider: weka\n    accessModes: {modes}\n    readerMountOptions: {options}\n"
    );
    for line in extra.lines() {
        s.push_str("    ");
        s.push_str(line);
        s.push('\n');
    }
    s
}

fn ok(name: &'static str, yaml: String) -> Vector {
    Vector {
        name,
        yaml,
        expect: Expect::Accept,
    }
}

fn bad(name: &'static str, yaml: String, path: &'static str, m: fn(&Refusal) -> bool) -> Vector {
    Vector {
        name,
        yaml,
        expect: Expect::Refuse(path, m),
    }
}

/// Every catalog vector. Paths are the loader's rendering.
pub fn vectors() -> Vec<Vector> {
    let one = |modes: &str, options: &str| doc(&driver("csi.example.com", modes, options, ""));
    let long_name = "a".repeat(253);
    let too_long_name = "a".repeat(254);
    let many_options: Vec<String> = (0..32).map(|i| format!("opt{i}")).collect();
    let too_many_options: Vec<String> = (0..33).map(|i| format!("opt{i}")).collect();
    vec![
        // --- accepted ---
        ok(
            "shipped catalog",
            warmcache_catalog::BUILTIN_CATALOG.to_owned(),
        ),
        ok(
            "rwo+rox with only ro, any provider",
            one("[ReadWriteOnce, ReadOnlyMany]", "[ro]"),
        ),
        ok(
            "rox listed first",
            one("[ReadOnlyMany, ReadWriteOnce]", "[ro, nouuid]"),
        ),
        ok(
            "rwo alone qualifies nothing but is valid",
            one("[ReadWriteOnce]", "[]"),
        ),
        ok(
            "rwx+rox with empty options",
            one("[ReadWriteMany, ReadOnlyMany]", "[]"),
        ),
        ok(
            "rwx with unused options",
            one("[ReadWriteMany]", "[ro, noatime]"),
        ),
        ok(
            "all three modes",
            one("[ReadWriteMany, ReadWriteOnce, ReadOnlyMany]", "[ro]"),
        ),
        ok("empty modes and options", one("[]", "[]")),
        ok(
            "encryption and writer identity",
            doc(&driver(
                "csi.example.com",
                "[ReadWriteMany]",
                "[]",
                "encryptionSupported: false\nwriterIdentity: root",
            )),
        ),
        ok(
            "writer identity fsGroup",
            doc(&driver(
                "csi.example.com",
                "[ReadWriteMany]",
                "[]",
                "writerIdentity: fsGroup",
            )),
        ),
        ok(
            "option with an inner space",
            one("[ReadWriteOnce, ReadOnlyMany]", "[ro, \"context=a b\"]"),
        ),
        ok(
            "NEL is not ECMA whitespace",
            one("[ReadWriteMany]", "[\"ro\\u0085\"]"),
        ),
        ok(
            "name of 253 characters",
            doc(&driver(&long_name, "[]", "[]", "")),
        ),
        ok(
            "32 mount options",
            one("[ReadWriteMany]", &format!("[{}]", many_options.join(", "))),
        ),
        ok(
            "two drivers",
            doc(&format!(
                "{}{}",
                driver("a.csi", "[ReadWriteMany]", "[]", ""),
                driver("b.csi", "[]", "[]", "")
            )),
        ),
        ok(
            "names differing only in case are distinct",
            doc(&format!(
                "{}{}",
                driver("a.csi", "[]", "[]", ""),
                driver("A.csi", "[]", "[]", "")
            )),
        ),
        // --- refused: document ---
        bad(
            "legacy transitions key",
            doc(&driver(
                "csi.example.com",
                "[ReadWriteMany]",
                "[]",
                "transitions:\n  regularModelCache: rwxReadOnly",
            )),
            "drivers[0].transitions",
            |r| matches!(r, Refusal::UnknownField { name, .. } if name == "transitions"),
        ),
        bad(
            "unknown root field",
            format!("{}metadata: {{}}\n", one("[]", "[]")),
            "metadata",
            |r| matches!(r, Refusal::UnknownField { name, .. } if name == "metadata"),
        ),
        bad(
            "wrong apiVersion",
            one("[]", "[]").replace("v1alpha1", "v1beta1"),
            "apiVersion",
            |r| {
                matches!(
                    r,
                    Refusal::WrongConstant {
                        field: "apiVersion",
                        ..
                    }
                )
            },
        ),
        bad(
            "missing apiVersion",
            one("[]", "[]").replace("apiVersion: storage.nvcf.nvidia.com/v1alpha1\n", ""),
            "apiVersion",
            |r| matches!(r, Refusal::Missing { .. }),
        ),
        bad(
            "wrong kind",
            one("[]", "[]").replace(
                "kind: StorageCapabilityCatalog",
                "kind: StorageCapabilities",
            ),
            "kind",
            |r| matches!(r, Refusal::WrongConstant { field: "kind", .. }),
        ),
        bad(
            "kind as a number",
            one("[]", "[]").replace("kind: StorageCapabilityCatalog", "kind: 3"),
            "kind",
            |r| matches!(r, Refusal::WrongConstant { field: "kind", .. }),
        ),
        bad(
            "no drivers",
            doc("").replace("drivers:\n", "drivers: []\n"),
            "drivers",
            |r| *r == Refusal::NoDrivers,
        ),
        bad(
            "drivers missing",
            doc("").replace("drivers:\n", ""),
            "drivers",
            |r| matches!(r, Refusal::Missing { .. }),
        ),
        bad("drivers null", doc(""), "drivers", |r| {
            matches!(r, Refusal::WrongType { found: "null", .. })
        }),
        bad("drivers as a mapping", doc("  a: b\n"), "drivers", |r| {
            matches!(
                r,
                Refusal::WrongType {
                    found: "a mapping",
                    ..
                }
            )
        }),
        bad("root is a list", "- a\n".to_owned(), "(root)", |r| {
            matches!(
                r,
                Refusal::WrongType {
                    found: "a list",
                    ..
                }
            )
        }),
        bad("root is a scalar", "hello\n".to_owned(), "(root)", |r| {
            matches!(
                r,
                Refusal::WrongType {
                    found: "a string",
                    ..
                }
            )
        }),
        bad(
            "empty document",
            "# only a comment\n".to_owned(),
            "(root)",
            |r| matches!(r, Refusal::WrongType { found: "null", .. }),
        ),
        bad(
            "driver is a scalar",
            doc("  - csi.weka.io\n"),
            "drivers[0]",
            |r| {
                matches!(
                    r,
                    Refusal::WrongType {
                        found: "a string",
                        ..
                    }
                )
            },
        ),
        // --- refused: name and provider ---
        bad(
            "missing name",
            doc("  - provider: weka\n    accessModes: []\n    readerMountOptions: []\n"),
            "drivers[0].name",
            |r| matches!(r, Refusal::Missing { .. }),
        ),
        bad(
            "empty name",
            doc(&driver("\"\"", "[]", "[]", "")),
            "drivers[0].name",
            |r| *r == Refusal::Blank { field: "name" },
        ),
        bad(
            "whitespace name",
            doc(&driver("\"   \"", "[]", "[]", "")),
            "drivers[0].name",
            |r| *r == Refusal::Blank { field: "name" },
        ),
        bad(
            "name with a leading space",
            doc(&driver("\" csi.weka.io\"", "[]", "[]", "")),
            "drivers[0].name",
            |r| matches!(r, Refusal::SurroundingWhitespace { .. }),
        ),
        bad(
            "name with a trailing BOM",
            doc(&driver("\"csi.weka.io\\ufeff\"", "[]", "[]", "")),
            "drivers[0].name",
            |r| matches!(r, Refusal::SurroundingWhitespace { .. }),
        ),
        bad(
            "name with an inner line break",
            doc(&driver("\"csi\\nweka\"", "[]", "[]", "")),
            "drivers[0].name",
            |r| matches!(r, Refusal::LineBreak { .. }),
        ),
        bad(
            "name too long",
            doc(&driver(&too_long_name, "[]", "[]", "")),
            "drivers[0].name",
            |r| {
                *r == Refusal::TooLong {
                    max: 253,
                    found: 254,
                }
            },
        ),
        bad(
            "name is a number",
            doc(&driver("42", "[]", "[]", "")),
            "drivers[0].name",
            |r| {
                matches!(
                    r,
                    Refusal::WrongType {
                        found: "a number",
                        ..
                    }
                )
            },
        ),
        bad(
            "blank provider",
            doc(&driver("csi.example.com", "[]", "[]", ""))
                .replace("provider: weka", "provider: \" \""),
            "drivers[0].provider",
            |r| *r == Refusal::Blank { field: "provider" },
        ),
        bad(
            "missing provider",
            doc(&driver("csi.example.com", "[]", "[]", "")).replace("    provider: weka\n", ""),
            "drivers[0].provider",
            |r| matches!(r, Refusal::Missing { .. }),
        ),
        Vector {
            name: "duplicate driver name",
            yaml: doc(&format!(
                "{}{}",
                driver("csi.weka.io", "[ReadWriteMany]", "[]", ""),
                driver("csi.weka.io", "[]", "[]", "")
            )),
            expect: Expect::RefuseLoaderOnly(
                "drivers[1].name",
                |r| matches!(r, Refusal::DuplicateDriver { name, first: 0 } if name == "csi.weka.io"),
            ),
        },
        // --- refused: access modes ---
        bad(
            "accessModes missing",
            doc(&driver("csi.example.com", "[]", "[]", "")).replace("    accessModes: []\n", ""),
            "drivers[0].accessModes",
            |r| {
                matches!(
                    r,
                    Refusal::ListNotStated {
                        field: "accessModes",
                        ..
                    }
                )
            },
        ),
        bad(
            "accessModes null",
            one("null", "[]"),
            "drivers[0].accessModes",
            |r| {
                matches!(
                    r,
                    Refusal::ListNotStated {
                        field: "accessModes",
                        ..
                    }
                )
            },
        ),
        bad(
            "accessModes as a string",
            one("ReadWriteMany", "[]"),
            "drivers[0].accessModes",
            |r| {
                matches!(
                    r,
                    Refusal::WrongType {
                        found: "a string",
                        ..
                    }
                )
            },
        ),
        bad(
            "ReadWriteOncePod is not a catalog mode",
            one("[ReadWriteOncePod]", "[]"),
            "drivers[0].accessModes[0]",
            |r| matches!(r, Refusal::InvalidAccessMode { .. }),
        ),
        bad(
            "lowercase mode",
            one("[ReadWriteMany, readwriteonce]", "[]"),
            "drivers[0].accessModes[1]",
            |r| matches!(r, Refusal::InvalidAccessMode { .. }),
        ),
        bad(
            "duplicate mode",
            one("[ReadWriteMany, ReadWriteMany]", "[]"),
            "drivers[0].accessModes[1]",
            |r| matches!(r, Refusal::DuplicateAccessMode { first: 0, .. }),
        ),
        bad(
            "rwo+rox without ro",
            one("[ReadWriteOnce, ReadOnlyMany]", "[norecovery, nouuid]"),
            "drivers[0].readerMountOptions",
            |r| matches!(r, Refusal::RoxShapeWithoutRo { .. }),
        ),
        bad(
            "rwo+rox with empty options",
            one("[ReadWriteOnce, ReadOnlyMany]", "[]"),
            "drivers[0].readerMountOptions",
            |r| matches!(r, Refusal::RoxShapeWithoutRo { .. }),
        ),
        bad(
            "rox with no writer mode",
            one("[ReadOnlyMany]", "[ro]"),
            "drivers[0].accessModes",
            |r| matches!(r, Refusal::RoxWithoutWriter { .. }),
        ),
        // --- refused: reader mount options ---
        bad(
            "readerMountOptions missing",
            doc(&driver("csi.example.com", "[]", "[]", ""))
                .replace("    readerMountOptions: []\n", ""),
            "drivers[0].readerMountOptions",
            |r| {
                matches!(
                    r,
                    Refusal::ListNotStated {
                        field: "readerMountOptions",
                        ..
                    }
                )
            },
        ),
        bad(
            "readerMountOptions null",
            one("[]", "~"),
            "drivers[0].readerMountOptions",
            |r| {
                matches!(
                    r,
                    Refusal::ListNotStated {
                        field: "readerMountOptions",
                        ..
                    }
                )
            },
        ),
        bad(
            "blank option",
            one("[ReadWriteMany]", "[\"\"]"),
            "drivers[0].readerMountOptions[0]",
            |r| {
                *r == Refusal::Blank {
                    field: "readerMountOption",
                }
            },
        ),
        bad(
            "option with surrounding whitespace",
            one("[ReadWriteMany]", "[\"ro \"]"),
            "drivers[0].readerMountOptions[0]",
            |r| matches!(r, Refusal::SurroundingWhitespace { .. }),
        ),
        bad(
            "option with a tab",
            one("[ReadWriteMany]", "[\"\\tro\"]"),
            "drivers[0].readerMountOptions[0]",
            |r| matches!(r, Refusal::SurroundingWhitespace { .. }),
        ),
        bad(
            "option with a line separator inside",
            one("[ReadWriteMany]", "[\"a\\u2028b\"]"),
            "drivers[0].readerMountOptions[0]",
            |r| matches!(r, Refusal::LineBreak { .. }),
        ),
        bad(
            "option with a carriage return inside",
            one("[ReadWriteMany]", "[\"a\\rb\"]"),
            "drivers[0].readerMountOptions[0]",
            |r| matches!(r, Refusal::LineBreak { .. }),
        ),
        bad(
            "duplicate option",
            one("[ReadWriteOnce, ReadOnlyMany]", "[ro, nouuid, ro]"),
            "drivers[0].readerMountOptions[2]",
            |r| matches!(r, Refusal::DuplicateMountOption { first: 0, .. }),
        ),
        bad(
            "ro and rw",
            one("[ReadWriteOnce, ReadOnlyMany]", "[ro, rw]"),
            "drivers[0].readerMountOptions[1]",
            |r| matches!(r, Refusal::WritableMountOption { value } if value == "rw"),
        ),
        bad(
            "rw alone on a ReadWriteMany driver",
            one("[ReadWriteMany]", "[rw]"),
            "drivers[0].readerMountOptions[0]",
            |r| matches!(r, Refusal::WritableMountOption { value } if value == "rw"),
        ),
        bad(
            "rw with a value",
            one("[ReadWriteMany]", "[\"rw=1\"]"),
            "drivers[0].readerMountOptions[0]",
            |r| matches!(r, Refusal::WritableMountOption { .. }),
        ),
        bad(
            "noro",
            one("[ReadWriteMany]", "[noro]"),
            "drivers[0].readerMountOptions[0]",
            |r| matches!(r, Refusal::WritableMountOption { .. }),
        ),
        bad(
            "ro with a value",
            one("[ReadWriteOnce, ReadOnlyMany]", "[ro, \"ro=0\"]"),
            "drivers[0].readerMountOptions[1]",
            |r| matches!(r, Refusal::WritableMountOption { .. }),
        ),
        bad(
            "a comma smuggles rw in",
            one("[ReadWriteOnce, ReadOnlyMany]", "[ro, \"norecovery,rw\"]"),
            "drivers[0].readerMountOptions[1]",
            |r| matches!(r, Refusal::MountOptionWithComma { value } if value == "norecovery,rw"),
        ),
        bad(
            "a comma in a harmless option",
            one("[ReadWriteMany]", "[\"noatime,nodiratime\"]"),
            "drivers[0].readerMountOptions[0]",
            |r| matches!(r, Refusal::MountOptionWithComma { .. }),
        ),
        bad(
            "norecovery and recovery",
            one(
                "[ReadWriteOnce, ReadOnlyMany]",
                "[ro, norecovery, recovery]",
            ),
            "drivers[0].readerMountOptions[2]",
            |r| matches!(r, Refusal::ConflictingMountOptions { earlier, later } if earlier == "norecovery" && later == "recovery"),
        ),
        bad(
            "uuid and nouuid",
            one("[ReadWriteMany]", "[uuid, nouuid]"),
            "drivers[0].readerMountOptions[1]",
            |r| matches!(r, Refusal::ConflictingMountOptions { .. }),
        ),
        bad(
            "option is a number",
            one("[ReadWriteMany]", "[5]"),
            "drivers[0].readerMountOptions[0]",
            |r| {
                matches!(
                    r,
                    Refusal::WrongType {
                        found: "a number",
                        ..
                    }
                )
            },
        ),
        bad(
            "33 options",
            one(
                "[ReadWriteMany]",
                &format!("[{}]", too_many_options.join(", ")),
            ),
            "drivers[0].readerMountOptions",
            |r| *r == Refusal::TooManyItems { max: 32, found: 33 },
        ),
        bad(
            "option too long",
            one("[ReadWriteMany]", &format!("[{}]", "o".repeat(257))),
            "drivers[0].readerMountOptions[0]",
            |r| {
                *r == Refusal::TooLong {
                    max: 256,
                    found: 257,
                }
            },
        ),
        // --- refused: encryption and writer identity ---
        bad(
            "encryptionSupported as a string",
            doc(&driver(
                "csi.example.com",
                "[]",
                "[]",
                "encryptionSupported: \"true\"",
            )),
            "drivers[0].encryptionSupported",
            |r| {
                matches!(
                    r,
                    Refusal::WrongType {
                        expected: "a boolean",
                        ..
                    }
                )
            },
        ),
        bad(
            "encryptionSupported null",
            doc(&driver(
                "csi.example.com",
                "[]",
                "[]",
                "encryptionSupported: null",
            )),
            "drivers[0].encryptionSupported",
            |r| matches!(r, Refusal::WrongType { found: "null", .. }),
        ),
        bad(
            "writerIdentity with another spelling",
            doc(&driver(
                "csi.example.com",
                "[ReadWriteMany]",
                "[]",
                "writerIdentity: Root",
            )),
            "drivers[0].writerIdentity",
            |r| matches!(r, Refusal::InvalidWriterIdentity { .. }),
        ),
        bad(
            "writerIdentity null",
            doc(&driver(
                "csi.example.com",
                "[ReadWriteMany]",
                "[]",
                "writerIdentity: null",
            )),
            "drivers[0].writerIdentity",
            |r| matches!(r, Refusal::InvalidWriterIdentity { .. }),
        ),
    ]
}
