//! The steps of the hook, against the API server. Objects are read as `DynamicObject`s, so a
//! custom resource that does not decode into today's types cannot stop an uninstall.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::Write;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span, warn};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_api_modelcache::v2beta1::ModelCacheBinding;
use warmcache_kube::error::{ErrorCategory, category};
use warmcache_kube::{has_finalizer, remove_finalizer};

use crate::report::{Report, RetainedVolume};
use crate::{Error, Settings};

/// The label warmcache puts on every object it creates, volumes of model data included.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=warmcache";

/// Report lines, written as they happen; the first write error is kept for the end.
struct Out<'a> {
    writer: &'a mut dyn Write,
    error: Option<std::io::Error>,
}

impl Out<'_> {
    fn line(&mut self, text: impl Display) {
        if self.error.is_some() {
            return;
        }
        if let Err(err) = writeln!(self.writer, "{text}").and_then(|()| self.writer.flush()) {
            self.error = Some(err);
        }
    }
}

/// An error with its causes, for a report line (kube's API errors carry the server's message).
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn finalizers(obj: &DynamicObject) -> String {
    format!("[{}]", obj.finalizers().join(", "))
}

/// How a wait ended early.
enum Pause {
    /// The poll interval passed.
    Again,
    /// The bound passed.
    TimedOut,
    /// SIGTERM/SIGINT (the Job's active deadline, a cancelled uninstall).
    Interrupted,
}

async fn pause(
    stop: &CancellationToken,
    started: Instant,
    bound: Duration,
    poll: Duration,
) -> Pause {
    let elapsed = started.elapsed();
    if elapsed >= bound {
        return Pause::TimedOut;
    }
    tokio::select! {
        () = stop.cancelled() => Pause::Interrupted,
        () = tokio::time::sleep(poll.min(bound - elapsed)) => Pause::Again,
    }
}

/// Runs the steps in order, writing the report to `out` as they happen; the last line is
/// [`Report::summary`]. `stop` (SIGTERM, SIGINT) ends any wait early: what is left is reported.
pub async fn uninstall(
    client: Client,
    settings: &Settings,
    stop: CancellationToken,
    out: &mut dyn Write,
) -> Result<Report, Error> {
    let mut out = Out {
        writer: out,
        error: None,
    };
    let mut report = Report::new(&settings.control_namespace);
    let ns = settings.control_namespace.as_str();

    if settings.kvcache_backends {
        backends(&client, settings, &stop, &mut report, &mut out)
            .instrument(info_span!("backends", force = settings.force))
            .await;
    } else {
        out.line("KVCacheBackends: skipped (--kvcache-backends=false)");
    }
    let strip = format!("remove the finalizers of the ModelCacheBindings in {ns}");
    let delete = format!("delete namespace {ns}");
    if report.left.is_empty() {
        bindings(&client, ns, &mut report, &mut out)
            .instrument(info_span!("bindings", namespace = ns))
            .await;
    } else {
        report.not_started.push(strip);
    }
    if !settings.delete_namespace {
        out.line(format!("namespace {ns}: kept (--delete-namespace=false)"));
    } else if report.left.is_empty() {
        namespace(&client, settings, &stop, &mut report, &mut out)
            .instrument(info_span!("namespace", namespace = ns))
            .await;
    } else {
        report.not_started.push(delete);
    }
    retained(&client, ns, &mut report)
        .instrument(info_span!("retained"))
        .await;
    for left in &report.left {
        out.line(format!("LEFT: {}: {}", left.object, left.why));
    }
    for step in &report.not_started {
        out.line(format!("NOT STARTED: {step}"));
    }
    for line in report.retained_lines() {
        out.line(line);
    }
    out.line(report.summary());
    match out.error {
        Some(err) => Err(Error::Output(err)),
        None => Ok(report),
    }
}

/// Step 1: delete every KVCacheBackend and wait for the operator's teardown (or, with
/// `--force`, remove its finalizer).
async fn backends(
    client: &Client,
    settings: &Settings,
    stop: &CancellationToken,
    report: &mut Report,
    out: &mut Out<'_>,
) {
    let resource = ApiResource::erase::<KVCacheBackend>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let started = Instant::now();
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    let mut errors: BTreeMap<String, String> = BTreeMap::new();
    let mut last: Vec<DynamicObject> = Vec::new();
    let mut first = true;
    let ended = loop {
        // Only a list that succeeded can show the backends gone: a failed one is retried until
        // the timeout, and reported if it never succeeds.
        let listed = match api.list(&ListParams::default()).await {
            Ok(list) => {
                last = list.items;
                true
            }
            Err(err) if category(&err) == ErrorCategory::NotFound => {
                out.line("KVCacheBackends: none (the CRD is not installed)");
                return;
            }
            Err(err) if category(&err).is_retryable() => {
                warn!(error = %err, "listing the KVCacheBackends failed; retrying");
                errors.insert(String::new(), format!("list: {}", chain(&err)));
                false
            }
            Err(err) => {
                report.leave(
                    "KVCacheBackends",
                    format!("cannot list them: {}", chain(&err)),
                );
                return;
            }
        };
        if !listed {
            match pause(
                stop,
                started,
                settings.backend_timeout,
                settings.poll_interval,
            )
            .await
            {
                Pause::Again => continue,
                Pause::TimedOut => {
                    break Some(format!(
                        "not listed within --backend-timeout {}s",
                        settings.backend_timeout.as_secs()
                    ));
                }
                Pause::Interrupted => break Some("interrupted while waiting".to_owned()),
            }
        }
        if first {
            out.line(format!(
                "KVCacheBackends: {} found{}",
                last.len(),
                if settings.force {
                    "; --force: removing the operator's finalizer instead of waiting"
                } else {
                    ""
                }
            ));
            first = false;
        }
        errors.remove("");
        for backend in &last {
            let name = backend.name_any();
            if seen.insert(name.clone(), ()).is_none() {
                out.line(format!("  deleting KVCacheBackend {name}"));
            }
            if backend.metadata.deletion_timestamp.is_none() {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(err) if category(&err) == ErrorCategory::NotFound => {}
                    Err(err) => {
                        errors.insert(name.clone(), format!("delete: {}", chain(&err)));
                        continue;
                    }
                }
            }
            if settings.force && has_finalizer(backend, warmcache_api_kvcache::FINALIZER) {
                match remove_finalizer(&api, backend, warmcache_api_kvcache::FINALIZER).await {
                    Ok(_) => {
                        report.backend_finalizers_removed.push(name.clone());
                        out.line(format!(
                            "  removed finalizer {} from KVCacheBackend {name}",
                            warmcache_api_kvcache::FINALIZER
                        ));
                    }
                    Err(err) if err.is_not_found() => {}
                    Err(err) => {
                        errors.insert(name.clone(), format!("remove finalizer: {}", chain(&err)));
                    }
                }
            }
        }
        if last.is_empty() {
            break None;
        }
        // An error other than a failed list: waiting would not change it.
        if errors.keys().any(|k| !k.is_empty()) {
            break Some("an API call failed".to_owned());
        }
        match pause(
            stop,
            started,
            settings.backend_timeout,
            settings.poll_interval,
        )
        .await
        {
            Pause::Again => {}
            Pause::TimedOut => {
                break Some(format!(
                    "still there after --backend-timeout {}s{}",
                    settings.backend_timeout.as_secs(),
                    if settings.force {
                        ""
                    } else {
                        ": the kvcache operator has not finished its teardown (is it running? --force removes its finalizer without emptying the tier)"
                    }
                ));
            }
            Pause::Interrupted => break Some("interrupted while waiting".to_owned()),
        }
    };
    let remaining: BTreeMap<String, &DynamicObject> =
        last.iter().map(|b| (b.name_any(), b)).collect();
    report.backends_removed = seen
        .keys()
        .filter(|name| !remaining.contains_key(*name))
        .cloned()
        .collect();
    if let Some(list_error) = errors.get("") {
        report.leave("KVCacheBackends", list_error.clone());
    }
    let Some(why) = ended else {
        out.line(format!(
            "KVCacheBackends: all gone ({} removed)",
            report.backends_removed.len()
        ));
        return;
    };
    for (name, backend) in remaining {
        let mut text = format!("finalizers {}", finalizers(backend));
        if let Some(status) = backend.data.get("status") {
            for key in ["phase", "phaseMessage"] {
                if let Some(value) = status.get(key).and_then(|v| v.as_str()) {
                    text.push_str(&format!(", {key} {value:?}"));
                }
            }
        }
        if let Some(err) = errors.get(&name) {
            text.push_str(&format!("; {err}"));
        } else {
            text.push_str(&format!("; {why}"));
        }
        report.leave(format!("KVCacheBackend {name}"), text);
    }
}

/// Removes the binding finalizer from every binding in `ns` that has it; returns the errors by
/// binding.
async fn strip_bindings(
    api: &Api<DynamicObject>,
    report: &mut Report,
    out: &mut Out<'_>,
) -> Result<BTreeMap<String, String>, kube::Error> {
    let list = api.list(&ListParams::default()).await?;
    let mut errors = BTreeMap::new();
    for binding in &list.items {
        if !has_finalizer(binding, warmcache_api_modelcache::FINALIZER) {
            continue;
        }
        let name = format!(
            "{}/{}",
            binding.namespace().unwrap_or_default(),
            binding.name_any()
        );
        match remove_finalizer(api, binding, warmcache_api_modelcache::FINALIZER).await {
            Ok(_) => {
                out.line(format!(
                    "  removed finalizer {} from ModelCacheBinding {name}",
                    warmcache_api_modelcache::FINALIZER
                ));
                report.binding_finalizers_removed.push(name);
            }
            Err(err) if err.is_not_found() => {}
            Err(err) => {
                errors.insert(
                    name,
                    format!("finalizers {}; {}", finalizers(binding), chain(&err)),
                );
            }
        }
    }
    Ok(errors)
}

fn bindings_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<ModelCacheBinding>(&());
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// Step 2: strip the binding finalizers in the control namespace.
async fn bindings(client: &Client, ns: &str, report: &mut Report, out: &mut Out<'_>) {
    let api = bindings_api(client, ns);
    match strip_bindings(&api, report, out).await {
        Ok(errors) => {
            for (name, why) in errors {
                report.leave(format!("ModelCacheBinding {name}"), why);
            }
            out.line(format!(
                "ModelCacheBindings in {ns}: finalizer removed from {}",
                report.binding_finalizers_removed.len()
            ));
        }
        Err(err) if category(&err) == ErrorCategory::NotFound => {
            out.line("ModelCacheBindings: none (the CRD is not installed)");
        }
        Err(err) => report.leave(
            format!("ModelCacheBindings in {ns}"),
            format!("cannot list them: {}", chain(&err)),
        ),
    }
}

/// Why a Terminating namespace is still there: its conditions that say so.
fn namespace_conditions(namespace: &Namespace) -> String {
    let conditions: Vec<String> = namespace
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.status == "True")
        .map(|c| {
            format!(
                "{}: {}",
                c.type_,
                c.message
                    .as_deref()
                    .unwrap_or(c.reason.as_deref().unwrap_or(""))
            )
        })
        .collect();
    if conditions.is_empty() {
        "no condition says why yet (kubectl get namespace -o yaml shows the namespace controller's progress)".to_owned()
    } else {
        conditions.join("; ")
    }
}

/// Step 3: delete the control namespace and wait until it is gone.
async fn namespace(
    client: &Client,
    settings: &Settings,
    stop: &CancellationToken,
    report: &mut Report,
    out: &mut Out<'_>,
) {
    let ns = settings.control_namespace.as_str();
    let object = format!("Namespace {ns}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let bindings = bindings_api(client, ns);
    let started = Instant::now();
    let mut asked = false;
    loop {
        let current = match namespaces.get_opt(ns).await {
            Ok(None) => {
                out.line(format!(
                    "namespace {ns}: gone{}",
                    if asked { "" } else { " (already)" }
                ));
                report.namespace_gone = true;
                return;
            }
            Ok(Some(current)) => current,
            Err(err) if category(&err).is_retryable() => {
                // Try again within the bound.
                let why = format!("get: {}", chain(&err));
                match pause(
                    stop,
                    started,
                    settings.namespace_timeout,
                    settings.poll_interval,
                )
                .await
                {
                    Pause::Again => continue,
                    Pause::TimedOut | Pause::Interrupted => {
                        report.leave(object, why);
                        return;
                    }
                }
            }
            Err(err) => {
                report.leave(object, format!("get: {}", chain(&err)));
                return;
            }
        };
        if current.metadata.deletion_timestamp.is_none() {
            match namespaces.delete(ns, &DeleteParams::default()).await {
                Ok(_) => out.line(format!("namespace {ns}: deleting")),
                Err(err) if category(&err) == ErrorCategory::NotFound => {}
                Err(err) => {
                    report.leave(object, format!("delete: {}", chain(&err)));
                    return;
                }
            }
            asked = true;
        } else if !asked {
            out.line(format!("namespace {ns}: Terminating; waiting"));
            asked = true;
        }
        // Bindings the webhook created before the namespace began Terminating.
        let mut why = namespace_conditions(&current);
        match strip_bindings(&bindings, report, out).await {
            Ok(errors) if !errors.is_empty() => {
                for (name, why) in errors {
                    report.leave(format!("ModelCacheBinding {name}"), why);
                }
                report.leave(
                    object,
                    format!("its ModelCacheBindings keep their finalizer; {why}"),
                );
                return;
            }
            Ok(_) => {}
            Err(err) if category(&err) == ErrorCategory::NotFound => {}
            Err(err) if category(&err).is_retryable() => {
                why.push_str(&format!("; list its ModelCacheBindings: {}", chain(&err)));
            }
            Err(err) => {
                report.leave(
                    object,
                    format!("list its ModelCacheBindings: {}", chain(&err)),
                );
                return;
            }
        }
        match pause(
            stop,
            started,
            settings.namespace_timeout,
            settings.poll_interval,
        )
        .await
        {
            Pause::Again => {}
            Pause::TimedOut => {
                // The namespace controller may have said why since the last look.
                if let Ok(Some(fresh)) = namespaces.get_opt(ns).await {
                    why = namespace_conditions(&fresh);
                }
                report.leave(
                    object,
                    format!(
                        "still Terminating after --namespace-timeout {}s: {why}",
                        settings.namespace_timeout.as_secs()
                    ),
                );
                return;
            }
            Pause::Interrupted => {
                report.leave(object, format!("interrupted while Terminating: {why}"));
                return;
            }
        }
    }
}

/// Lists the PersistentVolumes that keep model data: labelled by warmcache, or bound to a claim
/// of the control namespace (a primary whose download never completed carries no label).
async fn retained(client: &Client, ns: &str, report: &mut Report) {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    let list = match api.list(&ListParams::default()).await {
        Ok(list) => list,
        Err(err) => {
            report.retained_error = Some(chain(&err));
            return;
        }
    };
    for pv in list.items {
        let labelled = pv
            .labels()
            .get(warmcache_kube::MANAGED_BY_LABEL)
            .is_some_and(|v| v == warmcache_kube::MANAGED_BY_VALUE);
        let spec = pv.spec.as_ref();
        let claim = spec.and_then(|s| s.claim_ref.as_ref()).map(|c| {
            format!(
                "{}/{}",
                c.namespace.as_deref().unwrap_or_default(),
                c.name.as_deref().unwrap_or_default()
            )
        });
        let in_control = spec
            .and_then(|s| s.claim_ref.as_ref())
            .is_some_and(|c| c.namespace.as_deref() == Some(ns));
        if !(labelled || in_control) {
            continue;
        }
        report.retained.push(RetainedVolume {
            name: pv.name_any(),
            reclaim_policy: spec
                .and_then(|s| s.persistent_volume_reclaim_policy.clone())
                .unwrap_or_else(|| "unset".to_owned()),
            phase: pv
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "no phase".to_owned()),
            claim,
        });
    }
}
