//! The pure half of `qualify`: the checks, how the pods' termination messages are read and
//! judged, and the report (JSON and text). No client, no clock: the run passes in what it saw.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Serialize, Serializer};

/// `strerror(EROFS)` in glibc and musl, as shell tools print it.
pub const EROFS_TEXT: &str = "Read-only file system";

/// The kinds of write a reader attempts, each of which must fail with EROFS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WriteOp {
    /// `touch` a new file.
    Create,
    /// append to the payload.
    Append,
    /// `mv` the payload.
    Rename,
    /// `chmod` the payload.
    Chmod,
    /// `truncate` the payload.
    Truncate,
    /// `rm` the payload.
    Delete,
}

impl WriteOp {
    /// Every kind, in the order the reader tries them.
    pub const ALL: [WriteOp; 6] = [
        WriteOp::Create,
        WriteOp::Append,
        WriteOp::Chmod,
        WriteOp::Truncate,
        WriteOp::Rename,
        WriteOp::Delete,
    ];

    /// The word used in the reader's output and in the check name.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteOp::Create => "create",
            WriteOp::Append => "append",
            WriteOp::Rename => "rename",
            WriteOp::Chmod => "chmod",
            WriteOp::Truncate => "truncate",
            WriteOp::Delete => "delete",
        }
    }

    fn from_word(word: &str) -> Option<WriteOp> {
        WriteOp::ALL.into_iter().find(|op| op.as_str() == word)
    }
}

/// One check of seed 000's qualification. The names are stable: scripts and catalog citations
/// use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CheckName {
    /// A fresh claim of the class binds and a writer fills it with the payload.
    WriterPopulates,
    /// The class and the writer's PV use reclaim policy Retain.
    ReclaimRetain,
    /// After the writer exited and its claim was released, a read-only view in the writer's
    /// namespace reads identical bytes.
    DataSurvivesWriter,
    /// A read-only view in the other namespace reads identical bytes (SHA-256).
    ReaderIdenticalBytes,
    /// A write of this kind from the other namespace's reader fails with EROFS.
    ReaderWrite(WriteOp),
    /// After the write attempts the reader still reads identical bytes.
    ReaderDataUnchanged,
    /// A fresh claim naming only the class comes back without the payload.
    NegativeControlEmpty,
}

impl CheckName {
    /// Every check, in the order of the run.
    pub fn all() -> Vec<CheckName> {
        let mut all = vec![
            CheckName::WriterPopulates,
            CheckName::ReclaimRetain,
            CheckName::DataSurvivesWriter,
            CheckName::ReaderIdenticalBytes,
        ];
        all.extend(WriteOp::ALL.map(CheckName::ReaderWrite));
        all.push(CheckName::ReaderDataUnchanged);
        all.push(CheckName::NegativeControlEmpty);
        all
    }

    /// The stable name (`writer-populates`, `reader-create-erofs`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckName::WriterPopulates => "writer-populates",
            CheckName::ReclaimRetain => "reclaim-retain",
            CheckName::DataSurvivesWriter => "data-survives-writer",
            CheckName::ReaderIdenticalBytes => "reader-identical-bytes",
            CheckName::ReaderWrite(WriteOp::Create) => "reader-create-erofs",
            CheckName::ReaderWrite(WriteOp::Append) => "reader-append-erofs",
            CheckName::ReaderWrite(WriteOp::Rename) => "reader-rename-erofs",
            CheckName::ReaderWrite(WriteOp::Chmod) => "reader-chmod-erofs",
            CheckName::ReaderWrite(WriteOp::Truncate) => "reader-truncate-erofs",
            CheckName::ReaderWrite(WriteOp::Delete) => "reader-delete-erofs",
            CheckName::ReaderDataUnchanged => "reader-data-unchanged",
            CheckName::NegativeControlEmpty => "negative-control-empty",
        }
    }
}

impl Serialize for CheckName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum CheckStatus {
    /// Shown.
    Passed,
    /// Shown not to hold.
    Failed,
    /// Not reached (an earlier step failed, or the run was interrupted): not shown.
    NotRun,
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Which check.
    pub name: CheckName,
    /// Its outcome.
    pub status: CheckStatus,
    /// What was seen.
    pub detail: String,
}

impl Check {
    fn new(name: CheckName, passed: bool, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: if passed {
                CheckStatus::Passed
            } else {
                CheckStatus::Failed
            },
            detail: detail.into(),
        }
    }

    /// A failed check.
    pub fn failed(name: CheckName, detail: impl Into<String>) -> Check {
        Check::new(name, false, detail)
    }

    /// A passed check.
    pub fn passed(name: CheckName, detail: impl Into<String>) -> Check {
        Check::new(name, true, detail)
    }
}

/// The payload as the writer reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Payload {
    /// Lower-case hex SHA-256.
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
}

fn key_values(message: &str) -> BTreeMap<&str, &str> {
    message
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Reads the writer's termination message (`sha256=<hex>` and `bytes=<n>` lines).
///
/// # Errors
///
/// What is missing or malformed, with the message.
pub fn parse_writer(message: &str) -> Result<Payload, String> {
    let kv = key_values(message);
    let sha256 = kv
        .get("sha256")
        .filter(|s| is_sha256(s))
        .map(|s| s.to_ascii_lowercase())
        .ok_or_else(|| format!("the writer reported no SHA-256: {:?}", message.trim()))?;
    let bytes = kv
        .get("bytes")
        .and_then(|b| b.parse::<u64>().ok())
        .ok_or_else(|| format!("the writer reported no byte count: {:?}", message.trim()))?;
    Ok(Payload { sha256, bytes })
}

/// One write attempt of the reader: the tool's exit code and what it printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WriteAttempt {
    /// Which kind of write.
    #[serde(serialize_with = "op_name")]
    pub op: WriteOp,
    /// The tool's exit code.
    pub rc: i32,
    /// Its standard error.
    pub error: String,
}

fn op_name<S: Serializer>(op: &WriteOp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(op.as_str())
}

/// What a reader pod (or the negative control) reported in its termination message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReaderOutput {
    /// SHA-256 of the payload, `None` when the file was missing.
    pub sha256: Option<String>,
    /// Its size.
    pub bytes: Option<u64>,
    /// The mount's options as `/proc/mounts` shows them in the container.
    pub mount_options: Vec<String>,
    /// Entries at the root of the volume.
    pub entries: Option<u64>,
    /// The write attempts (cross-namespace reader only).
    pub writes: Vec<WriteAttempt>,
    /// SHA-256 of the payload after the write attempts.
    pub sha256_after: Option<String>,
}

impl ReaderOutput {
    /// Reads a reader's termination message (see `objects::READER_SCRIPT`).
    pub fn parse(message: &str) -> ReaderOutput {
        let mut out = ReaderOutput::default();
        for line in message.lines() {
            if let Some(rest) = line.strip_prefix("write.") {
                // write.<op> rc=<n> <error>
                let mut parts = rest.splitn(3, ' ');
                let op = parts.next().and_then(WriteOp::from_word);
                let rc = parts
                    .next()
                    .and_then(|r| r.strip_prefix("rc="))
                    .and_then(|r| r.parse::<i32>().ok());
                if let (Some(op), Some(rc)) = (op, rc) {
                    out.writes.push(WriteAttempt {
                        op,
                        rc,
                        error: parts.next().unwrap_or_default().trim().to_owned(),
                    });
                }
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.trim();
            match key.trim() {
                "sha256" => out.sha256 = is_sha256(value).then(|| value.to_ascii_lowercase()),
                "sha256-after" => {
                    out.sha256_after = is_sha256(value).then(|| value.to_ascii_lowercase());
                }
                "bytes" => out.bytes = value.parse().ok(),
                "entries" => out.entries = value.parse().ok(),
                "mount" => {
                    out.mount_options = value
                        .split(',')
                        .filter(|o| !o.is_empty())
                        .map(str::to_owned)
                        .collect();
                }
                _ => {}
            }
        }
        out
    }
}

/// Judges whether a reader read the writer's bytes (`check` is
/// [`CheckName::DataSurvivesWriter`] or [`CheckName::ReaderIdenticalBytes`]).
pub fn evaluate_reader(check: CheckName, expected: &Payload, seen: &ReaderOutput) -> Check {
    match (&seen.sha256, seen.bytes) {
        (Some(sha), Some(bytes)) if *sha == expected.sha256 && bytes == expected.bytes => {
            Check::passed(check, format!("sha256 {sha}, {bytes} bytes, as written"))
        }
        (Some(sha), bytes) => Check::failed(
            check,
            format!(
                "read sha256 {sha} ({} bytes), the writer wrote {} ({} bytes): a different volume or corrupted data",
                bytes.map_or_else(|| "?".to_owned(), |b| b.to_string()),
                expected.sha256,
                expected.bytes
            ),
        ),
        (None, _) => Check::failed(
            check,
            format!(
                "the payload is missing ({} entries at the volume's root): the reader mounted a volume without the writer's data",
                seen.entries
                    .map_or_else(|| "?".to_owned(), |e| e.to_string())
            ),
        ),
    }
}

/// Judges one kind of write: it must have failed with EROFS.
pub fn evaluate_write(op: WriteOp, seen: &ReaderOutput) -> Check {
    let name = CheckName::ReaderWrite(op);
    match seen.writes.iter().find(|w| w.op == op) {
        None => Check::failed(name, "the reader did not report this write attempt"),
        Some(w) if w.rc == 0 => Check::failed(
            name,
            format!("the {} succeeded: the reader can write", op.as_str()),
        ),
        Some(w) if w.error.contains(EROFS_TEXT) => {
            Check::passed(name, format!("refused: {}", w.error))
        }
        Some(w) => Check::failed(
            name,
            format!(
                "refused, but not with EROFS (exit {}): {}",
                w.rc,
                if w.error.is_empty() {
                    "no message"
                } else {
                    &w.error
                }
            ),
        ),
    }
}

/// Judges that the reader's write attempts changed nothing.
pub fn evaluate_unchanged(expected: &Payload, seen: &ReaderOutput) -> Check {
    let name = CheckName::ReaderDataUnchanged;
    match &seen.sha256_after {
        Some(sha) if *sha == expected.sha256 => {
            Check::passed(name, "the payload is unchanged after the write attempts")
        }
        Some(sha) => Check::failed(
            name,
            format!(
                "after the write attempts the payload hashes to {sha}, not {}",
                expected.sha256
            ),
        ),
        None => Check::failed(name, "after the write attempts the payload is gone"),
    }
}

/// Judges the reclaim policy of the class and of the PV its claim got.
pub fn evaluate_retain(class_policy: Option<&str>, pv_policy: Option<&str>) -> Check {
    let name = CheckName::ReclaimRetain;
    // A StorageClass without reclaimPolicy means Delete.
    let class = class_policy.unwrap_or("Delete");
    let pv = pv_policy.unwrap_or("unset");
    if class == "Retain" && pv == "Retain" {
        Check::passed(
            name,
            "StorageClass and PersistentVolume: reclaimPolicy Retain",
        )
    } else {
        Check::failed(
            name,
            format!(
                "StorageClass reclaimPolicy {class}, PersistentVolume {pv}: a cache needs Retain (create a Retain class for it)"
            ),
        )
    }
}

/// Judges the negative control: a fresh claim of the class must not show the payload.
pub fn evaluate_negative(expected: &Payload, seen: &ReaderOutput) -> Check {
    let name = CheckName::NegativeControlEmpty;
    match &seen.sha256 {
        None => Check::passed(
            name,
            format!(
                "a fresh claim of the class has no payload ({} entries): readers must read derived views, never class-only claims",
                seen.entries
                    .map_or_else(|| "?".to_owned(), |e| e.to_string())
            ),
        ),
        Some(sha) if *sha == expected.sha256 => Check::failed(
            name,
            "a fresh claim of the class shows the writer's payload: the class does not give a new volume per claim, so the readers' result proves nothing",
        ),
        Some(sha) => Check::failed(
            name,
            format!("a fresh claim of the class already holds a payload (sha256 {sha})"),
        ),
    }
}

/// The StorageClass and its driver, as read at the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageFacts {
    /// The class.
    pub name: String,
    /// Its provisioner (the catalog entry's `name`).
    pub provisioner: String,
    /// Its reclaimPolicy (absent: Delete).
    pub reclaim_policy: Option<String>,
    /// Its volumeBindingMode.
    pub volume_binding_mode: Option<String>,
    /// The CSIDriver's fsGroupPolicy (who may write a fresh export).
    pub fs_group_policy: Option<String>,
    /// The CSIDriver's attachRequired.
    pub attach_required: Option<bool>,
}

/// The writer's side.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriterFacts {
    /// The access mode of the claim that was populated.
    pub access_mode: Option<String>,
    /// Each claim tried, and how it went.
    pub attempts: Vec<String>,
    /// The claim.
    pub persistent_volume_claim: Option<String>,
    /// Its PV.
    pub persistent_volume: Option<String>,
    /// The PV's CSI volume handle.
    pub volume_handle: Option<String>,
    /// What the writer wrote.
    pub payload: Option<Payload>,
    /// How the writer's attachment went away before the read-only views were attached.
    pub detach: Option<String>,
}

/// One read-only view and what its reader saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ViewFacts {
    /// The reader's namespace.
    pub namespace: String,
    /// The view's PV.
    pub persistent_volume: String,
    /// Its pre-bound claim.
    pub persistent_volume_claim: String,
    /// The view's CSI volume handle (rewritten per namespace when the provider's handles
    /// encode it).
    pub volume_handle: String,
    /// The view PV's mountOptions.
    pub mount_options: Vec<String>,
    /// What the reader reported.
    pub seen: Option<ReaderOutput>,
}

/// The catalog entry the run supports (only when qualified).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntry {
    /// The provisioner.
    pub name: String,
    /// The provider label the views were derived for (`null`: choose one).
    pub provider: Option<String>,
    /// The modes the run used end to end: the writer's and ReadOnlyMany (the views).
    pub access_modes: Vec<String>,
    /// The views' mount options (ReadWriteOnce storage), `[]` on ReadWriteMany.
    pub reader_mount_options: Vec<String>,
}

/// What the cleanup removed and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cleanup {
    /// `<kind> <namespace>/<name>` of each object removed.
    pub removed: Vec<String>,
    /// Objects still there at the end of the cleanup, with why.
    pub leftovers: Vec<String>,
    /// A command removing the leftovers by the run's label.
    pub command: Option<String>,
}

/// The whole report of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Always `StorageQualificationReport`.
    pub kind: &'static str,
    /// The run's id (the value of the run label on every object it made).
    pub run: String,
    /// When it started and finished (RFC 3339).
    pub started_at: String,
    /// When it finished.
    pub finished_at: String,
    /// Whether every check passed.
    pub qualified: bool,
    /// Why the run stopped early (a signal), if it did.
    pub interrupted: Option<String>,
    /// The class under test.
    pub storage_class: StorageFacts,
    /// The writer's namespace.
    pub namespace_a: String,
    /// The cross-namespace reader's.
    pub namespace_b: String,
    /// The pods' image.
    pub image: String,
    /// The provider the views were derived for.
    pub provider: Option<String>,
    /// The writer.
    pub writer: WriterFacts,
    /// The read-only views (A, then B).
    pub views: Vec<ViewFacts>,
    /// What the negative control saw.
    pub negative_control: Option<ReaderOutput>,
    /// Every check, in order.
    pub checks: Vec<Check>,
    /// The names of the checks that did not pass.
    pub failed_checks: Vec<&'static str>,
    /// The catalog entry the run supports, when qualified.
    pub catalog_entry: Option<CatalogEntry>,
    /// The cleanup.
    pub cleanup: Cleanup,
}

impl Report {
    /// A report with every check not run yet.
    pub fn new(run: &str, started_at: String, namespace_a: &str, namespace_b: &str) -> Report {
        Report {
            kind: "StorageQualificationReport",
            run: run.to_owned(),
            finished_at: started_at.clone(),
            started_at,
            qualified: false,
            interrupted: None,
            storage_class: StorageFacts::default(),
            namespace_a: namespace_a.to_owned(),
            namespace_b: namespace_b.to_owned(),
            image: String::new(),
            provider: None,
            writer: WriterFacts::default(),
            views: Vec::new(),
            negative_control: None,
            checks: CheckName::all()
                .into_iter()
                .map(|name| Check {
                    name,
                    status: CheckStatus::NotRun,
                    detail: "not reached".to_owned(),
                })
                .collect(),
            failed_checks: Vec::new(),
            catalog_entry: None,
            cleanup: Cleanup::default(),
        }
    }

    /// Records a check's outcome.
    pub fn set(&mut self, check: Check) {
        tracing::info!(check = check.name.as_str(), status = ?check.status, detail = %check.detail, "check");
        if let Some(slot) = self.checks.iter_mut().find(|c| c.name == check.name) {
            *slot = check;
        }
    }

    /// Gives every check not run yet `reason`.
    pub fn not_reached(&mut self, reason: &str) {
        for c in &mut self.checks {
            if c.status == CheckStatus::NotRun {
                c.detail = reason.to_owned();
            }
        }
    }

    /// The outcome of one check.
    pub fn check(&self, name: CheckName) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// Computes the verdict, the failed checks and the catalog entry.
    pub fn finish(&mut self, finished_at: String) {
        self.finished_at = finished_at;
        self.failed_checks = self
            .checks
            .iter()
            .filter(|c| c.status != CheckStatus::Passed)
            .map(|c| c.name.as_str())
            .collect();
        self.qualified = self.failed_checks.is_empty() && self.interrupted.is_none();
        self.catalog_entry = match (&self.writer.access_mode, self.qualified) {
            (Some(mode), true) => Some(CatalogEntry {
                name: self.storage_class.provisioner.clone(),
                provider: self.provider.clone(),
                access_modes: vec![mode.clone(), "ReadOnlyMany".to_owned()],
                reader_mount_options: if mode == "ReadWriteMany" {
                    Vec::new()
                } else {
                    self.views
                        .first()
                        .map(|v| v.mount_options.clone())
                        .unwrap_or_default()
                },
            }),
            _ => None,
        };
    }

    /// The report as lines to read, and to cite in the commit of a catalog change.
    pub fn text(&self) -> String {
        let mut t = String::new();
        let sc = &self.storage_class;
        let verdict = if self.qualified {
            "QUALIFIED"
        } else if self.interrupted.is_some() {
            "INTERRUPTED (no verdict)"
        } else {
            "NOT QUALIFIED"
        };
        let _ = writeln!(t, "Storage qualification {}: {verdict}", self.run);
        let _ = writeln!(
            t,
            "  class {} provisioner {} reclaimPolicy {} bindingMode {} fsGroupPolicy {} attachRequired {}",
            sc.name,
            sc.provisioner,
            sc.reclaim_policy.as_deref().unwrap_or("Delete (unset)"),
            sc.volume_binding_mode
                .as_deref()
                .unwrap_or("Immediate (unset)"),
            sc.fs_group_policy.as_deref().unwrap_or("(no CSIDriver)"),
            sc.attach_required
                .map_or_else(|| "?".to_owned(), |a| a.to_string()),
        );
        let _ = writeln!(
            t,
            "  writer namespace {}, reader namespace {}, image {}, provider {}",
            self.namespace_a,
            self.namespace_b,
            self.image,
            self.provider.as_deref().unwrap_or("(none: handles reused)")
        );
        let w = &self.writer;
        for attempt in &w.attempts {
            let _ = writeln!(t, "  writer claim: {attempt}");
        }
        if let Some(p) = &w.payload {
            let _ = writeln!(
                t,
                "  payload {} bytes sha256 {} on PV {} handle {}",
                p.bytes,
                p.sha256,
                w.persistent_volume.as_deref().unwrap_or("?"),
                w.volume_handle.as_deref().unwrap_or("?")
            );
        }
        if let Some(d) = &w.detach {
            let _ = writeln!(t, "  detach: {d}");
        }
        for v in &self.views {
            let _ = writeln!(
                t,
                "  view in {}: PV {} handle {} mountOptions [{}]{}",
                v.namespace,
                v.persistent_volume,
                v.volume_handle,
                v.mount_options.join(","),
                v.seen.as_ref().map_or_else(String::new, |s| format!(
                    ", mounted ({})",
                    s.mount_options.join(",")
                ))
            );
        }
        let _ = writeln!(t, "Checks:");
        for c in &self.checks {
            let mark = match c.status {
                CheckStatus::Passed => "PASS",
                CheckStatus::Failed => "FAIL",
                CheckStatus::NotRun => "NOT RUN",
            };
            let _ = writeln!(t, "  {mark:7} {:24} {}", c.name.as_str(), c.detail);
        }
        if !self.failed_checks.is_empty() {
            let _ = writeln!(t, "Failed: {}", self.failed_checks.join(", "));
        }
        if let Some(e) = &self.catalog_entry {
            let _ = writeln!(t, "Catalog entry this run supports:");
            let _ = writeln!(t, "  - name: {}", e.name);
            let _ = writeln!(
                t,
                "    provider: {}",
                e.provider.as_deref().unwrap_or("<choose a provider label>")
            );
            let _ = writeln!(t, "    accessModes: [{}]", e.access_modes.join(", "));
            let _ = writeln!(
                t,
                "    readerMountOptions: [{}]",
                e.reader_mount_options.join(", ")
            );
        }
        let _ = writeln!(
            t,
            "Cleanup: {} objects removed{}",
            self.cleanup.removed.len(),
            if self.cleanup.leftovers.is_empty() {
                String::new()
            } else {
                format!(
                    "; LEFT OVER: {}{}",
                    self.cleanup.leftovers.join("; "),
                    self.cleanup
                        .command
                        .as_deref()
                        .map(|c| format!("; remove with: {c}"))
                        .unwrap_or_default()
                )
            }
        );
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    const OTHER: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn payload() -> Payload {
        Payload {
            sha256: SHA.into(),
            bytes: 16 << 20,
        }
    }

    fn refused_everywhere() -> String {
        let mut m = format!(
            "sha256={SHA}\nbytes={}\nmount=ro,relatime\nentries=1\n",
            16 << 20
        );
        for op in WriteOp::ALL {
            m.push_str(&format!(
                "write.{} rc=1 {}: /data/qualify/x: Read-only file system\n",
                op.as_str(),
                op.as_str()
            ));
        }
        m.push_str(&format!("sha256-after={SHA}\n"));
        m
    }

    #[test]
    fn writer_messages_are_read_or_refused_with_the_message() {
        assert_eq!(
            parse_writer(&format!("sha256={}\nbytes=16777216\n", SHA.to_uppercase())),
            Ok(payload())
        );
        let err = parse_writer("mkdir: can't create directory '/data/qualify': Permission denied")
            .unwrap_err();
        assert!(err.contains("Permission denied"), "{err}");
        assert!(parse_writer(&format!("sha256={SHA}\n")).is_err());
        assert!(parse_writer("sha256=abc\nbytes=1").is_err());
    }

    #[test]
    fn reader_output_parses_every_line_and_ignores_noise() {
        let seen = ReaderOutput::parse(&format!(
            "noise\n{}write.bogus rc=1 x\n",
            refused_everywhere()
        ));
        assert_eq!(seen.sha256.as_deref(), Some(SHA));
        assert_eq!(seen.bytes, Some(16 << 20));
        assert_eq!(seen.mount_options, ["ro", "relatime"]);
        assert_eq!(seen.entries, Some(1));
        assert_eq!(seen.writes.len(), 6);
        assert_eq!(seen.sha256_after.as_deref(), Some(SHA));
        let missing = ReaderOutput::parse("sha256=missing\nentries=0\nmount=ro\n");
        assert_eq!(missing.sha256, None);
        assert_eq!(missing.entries, Some(0));
    }

    #[test]
    fn identical_bytes_need_the_same_hash_and_size() {
        let seen = ReaderOutput::parse(&refused_everywhere());
        let c = evaluate_reader(CheckName::ReaderIdenticalBytes, &payload(), &seen);
        assert_eq!(c.status, CheckStatus::Passed, "{c:?}");
        let other = ReaderOutput::parse(&format!("sha256={OTHER}\nbytes=16777216\n"));
        let c = evaluate_reader(CheckName::ReaderIdenticalBytes, &payload(), &other);
        assert_eq!(c.status, CheckStatus::Failed);
        assert!(c.detail.contains(OTHER), "{}", c.detail);
        let short = ReaderOutput::parse(&format!("sha256={SHA}\nbytes=12\n"));
        assert_eq!(
            evaluate_reader(CheckName::DataSurvivesWriter, &payload(), &short).status,
            CheckStatus::Failed
        );
        let empty = ReaderOutput::parse("sha256=missing\nentries=0\n");
        let c = evaluate_reader(CheckName::ReaderIdenticalBytes, &payload(), &empty);
        assert_eq!(c.status, CheckStatus::Failed);
        assert!(c.detail.contains("missing (0 entries"), "{}", c.detail);
    }

    #[test]
    fn writes_pass_only_when_refused_with_erofs() {
        let seen = ReaderOutput::parse(&refused_everywhere());
        for op in WriteOp::ALL {
            assert_eq!(
                evaluate_write(op, &seen).status,
                CheckStatus::Passed,
                "{op:?}"
            );
        }
        let seen = ReaderOutput::parse(
            "write.create rc=0 \nwrite.append rc=1 sh: can't create /data/x: Permission denied\n",
        );
        let c = evaluate_write(WriteOp::Create, &seen);
        assert_eq!(c.status, CheckStatus::Failed);
        assert!(c.detail.contains("succeeded"), "{}", c.detail);
        let c = evaluate_write(WriteOp::Append, &seen);
        assert_eq!(c.status, CheckStatus::Failed);
        assert!(c.detail.contains("not with EROFS"), "{}", c.detail);
        let c = evaluate_write(WriteOp::Delete, &seen);
        assert_eq!(c.status, CheckStatus::Failed);
        assert!(c.detail.contains("did not report"), "{}", c.detail);
        // The payload changed under the attempts.
        let changed = ReaderOutput::parse(&format!("sha256-after={OTHER}\n"));
        assert_eq!(
            evaluate_unchanged(&payload(), &changed).status,
            CheckStatus::Failed
        );
        assert_eq!(
            evaluate_unchanged(&payload(), &ReaderOutput::default()).status,
            CheckStatus::Failed
        );
    }

    #[test]
    fn retain_needs_both_the_class_and_the_volume() {
        assert_eq!(
            evaluate_retain(Some("Retain"), Some("Retain")).status,
            CheckStatus::Passed
        );
        let c = evaluate_retain(None, Some("Delete"));
        assert_eq!(c.status, CheckStatus::Failed);
        assert!(
            c.detail.contains("StorageClass reclaimPolicy Delete"),
            "{}",
            c.detail
        );
        assert_eq!(
            evaluate_retain(Some("Retain"), None).status,
            CheckStatus::Failed
        );
    }

    #[test]
    fn the_negative_control_must_come_back_empty() {
        let empty = ReaderOutput::parse("sha256=missing\nentries=0\n");
        assert_eq!(
            evaluate_negative(&payload(), &empty).status,
            CheckStatus::Passed
        );
        let same = ReaderOutput::parse(&format!("sha256={SHA}\n"));
        let c = evaluate_negative(&payload(), &same);
        assert_eq!(c.status, CheckStatus::Failed);
        assert!(c.detail.contains("proves nothing"), "{}", c.detail);
    }

    #[test]
    fn the_report_names_every_failed_check_and_suggests_an_entry_only_when_qualified() {
        let mut r = Report::new("abc123", "2026-12-01T00:00:00Z".into(), "a", "b");
        r.storage_class.provisioner = "csi.example.com".into();
        r.writer.access_mode = Some("ReadWriteOnce".into());
        r.views.push(ViewFacts {
            mount_options: vec!["ro".into(), "nouuid".into()],
            ..ViewFacts::default()
        });
        let names = CheckName::all();
        assert_eq!(names.len(), 12);
        for name in &names {
            r.set(Check::passed(*name, "ok"));
        }
        r.finish("2026-12-01T00:01:00Z".into());
        assert!(r.qualified);
        assert!(r.failed_checks.is_empty());
        let entry = r.catalog_entry.clone().unwrap();
        assert_eq!(entry.access_modes, ["ReadWriteOnce", "ReadOnlyMany"]);
        assert_eq!(entry.reader_mount_options, ["ro", "nouuid"]);
        assert!(r.text().contains("QUALIFIED"), "{}", r.text());

        r.set(Check::failed(
            CheckName::ReaderIdenticalBytes,
            "payload missing",
        ));
        r.set(Check {
            name: CheckName::NegativeControlEmpty,
            status: CheckStatus::NotRun,
            detail: "x".into(),
        });
        r.finish("2026-12-01T00:02:00Z".into());
        assert!(!r.qualified);
        assert_eq!(
            r.failed_checks,
            ["reader-identical-bytes", "negative-control-empty"]
        );
        assert_eq!(r.catalog_entry, None);
        let text = r.text();
        assert!(text.contains("NOT QUALIFIED"), "{text}");
        assert!(
            text.contains("Failed: reader-identical-bytes, negative-control-empty"),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["kind"], "StorageQualificationReport");
        assert_eq!(json["checks"][3]["name"], "reader-identical-bytes");
        assert_eq!(json["checks"][3]["status"], "failed");
        assert_eq!(json["checks"][11]["status"], "notRun");
        assert_eq!(json["failedChecks"][0], "reader-identical-bytes");

        // Interrupted: no verdict, whatever passed.
        let mut r = Report::new("x", "t".into(), "a", "b");
        for name in &names {
            r.set(Check::passed(*name, "ok"));
        }
        r.interrupted = Some("SIGINT".into());
        r.finish("t".into());
        assert!(!r.qualified);
        assert!(r.text().contains("INTERRUPTED"));
        // RWX: no reader mount options in the entry.
        let mut r = Report::new("x", "t".into(), "a", "b");
        for name in &names {
            r.set(Check::passed(*name, "ok"));
        }
        r.writer.access_mode = Some("ReadWriteMany".into());
        r.finish("t".into());
        let entry = r.catalog_entry.unwrap();
        assert_eq!(entry.access_modes, ["ReadWriteMany", "ReadOnlyMany"]);
        assert!(entry.reader_mount_options.is_empty());
    }

    #[test]
    fn check_names_are_unique_and_stable() {
        let names: Vec<&str> = CheckName::all().iter().map(|c| c.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        assert!(names.contains(&"reader-truncate-erofs"));
    }
}
